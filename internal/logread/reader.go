// Package logread reads a JetStream stream in order from a sequence on, without acking, for
// the rebuilds of the projections.
package logread

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Reader reads a stream (filtered or not) in order from a sequence on, with one pull consumer that acks nothing. An ordered consumer is not used: it deletes and
// creates its server-side consumer at every Fetch, and creating a filtered consumer makes
// the server count its pending messages, at a cost that grows with the stream (on a log of
// 10,000,000 readings that dominated the rebuild). Like an ordered consumer, the reader
// recreates its consumer right after the last message it returned when the consumer
// sequence has a gap (a pull answer lost) or the consumer is gone.
type Reader struct {
	js     jetstream.JetStream
	stream string
	filter string
	next   uint64 // the stream sequence to (re)start at
	cons   jetstream.Consumer
	cseq   uint64 // the consumer sequence of the last message returned
}

// New opens stream (filtered by filter, "" for all) at sequence start (0 or 1: the
// beginning).
func New(ctx context.Context, js jetstream.JetStream, stream, filter string, start uint64) (*Reader, error) {
	r := &Reader{js: js, stream: stream, filter: filter, next: max(start, 1)}
	if err := r.open(ctx); err != nil {
		return nil, err
	}
	return r, nil
}

func (r *Reader) open(ctx context.Context) error {
	cfg := jetstream.ConsumerConfig{
		FilterSubject: r.filter, AckPolicy: jetstream.AckNonePolicy,
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: r.next,
		InactiveThreshold: 5 * time.Minute, MemoryStorage: true, Replicas: 1,
	}
	// The server counts a new filtered consumer's pending messages, which on a large and
	// busy stream can take longer than the API's default 5 s: give it time, and retry.
	var err error
	for range 3 {
		actx, cancel := context.WithTimeout(ctx, openTimeout)
		var cons jetstream.Consumer
		cons, err = r.js.CreateConsumer(actx, r.stream, cfg)
		cancel()
		if err == nil {
			r.cons, r.cseq = cons, 0
			return nil
		}
		if ctx.Err() != nil || !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, nats.ErrTimeout) {
			break
		}
	}
	return fmt.Errorf("%s consumer from seq %d: %w", r.stream, r.next, err)
}

// StreamState is stream's state as of now: js.Stream asks the server for the stream's info,
// so its cached info is current and a second request (st.Info) would ask again.
func StreamState(ctx context.Context, js jetstream.JetStream, stream string) (jetstream.StreamState, error) {
	st, err := js.Stream(ctx, stream)
	if err != nil {
		return jetstream.StreamState{}, fmt.Errorf("%s info: %w", stream, err)
	}
	return st.CachedInfo().State, nil
}

// openTimeout bounds one attempt to create a reader's consumer.
const openTimeout = time.Minute

// Pending is the number of messages after the last one returned, as the consumer was
// created (exact then; md.NumPending of each message keeps it current).
func (r *Reader) Pending() uint64 { return r.cons.CachedInfo().NumPending }

// Info asks the server for the consumer's state.
func (r *Reader) Info(ctx context.Context) (*jetstream.ConsumerInfo, error) {
	info, err := r.cons.Info(ctx)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		if err := r.reset(ctx); err != nil {
			return nil, err
		}
		return r.cons.Info(ctx)
	}
	return info, err
}

// reset replaces the consumer with one starting after the last message returned.
func (r *Reader) reset(ctx context.Context) error {
	if r.cons != nil {
		_ = r.js.DeleteConsumer(ctx, r.stream, r.cons.CachedInfo().Name)
		r.cons = nil
	}
	return r.open(ctx)
}

// Close deletes the consumer.
func (r *Reader) Close(ctx context.Context) {
	if r.cons != nil {
		_ = r.js.DeleteConsumer(context.WithoutCancel(ctx), r.stream, r.cons.CachedInfo().Name)
		r.cons = nil
	}
}

// Fetch returns up to n next messages: those at hand, or when wait > 0 those that come
// within wait. No message is returned twice or skipped.
func (r *Reader) Fetch(ctx context.Context, n int, wait time.Duration) ([]jetstream.Msg, error) {
	msgs, gap, err := r.fetchOnce(ctx, n, wait)
	if err == nil && gap && len(msgs) == 0 {
		// Recreated after a gap: what was lost comes again at once.
		msgs, _, err = r.fetchOnce(ctx, n, wait)
	}
	return msgs, err
}

func (r *Reader) fetchOnce(ctx context.Context, n int, wait time.Duration) (_ []jetstream.Msg, gap bool, _ error) {
	if r.cons == nil {
		if err := r.open(ctx); err != nil {
			return nil, false, err
		}
	}
	var b jetstream.MessageBatch
	var err error
	if wait > 0 {
		b, err = r.cons.Fetch(n, jetstream.FetchMaxWait(wait))
	} else {
		b, err = r.cons.FetchNoWait(n)
	}
	msgs, err := Drain(b, err)
	out := msgs[:0]
	for _, m := range msgs {
		md, merr := m.Metadata()
		if merr != nil || md.Sequence.Consumer != r.cseq+1 {
			gap = true
			break
		}
		r.cseq, r.next = md.Sequence.Consumer, md.Sequence.Stream+1
		out = append(out, m)
	}
	switch {
	case err != nil && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout)) && ctx.Err() == nil:
		err = nil
	case errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrConsumerDeleted) || errors.Is(err, jetstream.ErrNoHeartbeat) ||
		errors.Is(err, nats.ErrNoResponders):
		gap, err = true, nil
	}
	if gap {
		if rerr := r.reset(ctx); rerr != nil {
			return out, gap, rerr
		}
	}
	if err != nil {
		return out, gap, fmt.Errorf("read %s: %w", r.stream, err)
	}
	return out, gap, nil
}

// Drain collects a fetched batch; the end of the messages (ErrNoMessages) is no error.
func Drain(b jetstream.MessageBatch, err error) ([]jetstream.Msg, error) {
	if err != nil {
		return nil, err
	}
	var out []jetstream.Msg
	for m := range b.Messages() {
		out = append(out, m)
	}
	if err := b.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
		return out, err
	}
	return out, nil
}
