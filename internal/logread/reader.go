// Package logread is the one way a part reads a stream (or one partition of it): in order,
// as contiguous runs of messages. The parts that follow the log (state and history
// projectors, notifier, watchdog) read their durable consumers through it, and the rebuilds
// read with it from a sequence on, acking nothing.
package logread

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/lock-sensors/lock-sensors/internal/natsx"
)

// Spec says which consumer a Reader reads and where it starts.
type Spec struct {
	Stream string
	// Filter is the subject filter ("" for the whole stream).
	Filter string
	// Durable names the consumer; "" lets the server name it (the rebuilds' readers).
	Durable     string
	Description string
	// AckPolicy is the consumer's; AckAll is safe with a Reader, since nothing past a gap is
	// ever handed out, so an ack never covers a message that was not processed.
	AckPolicy         jetstream.AckPolicy
	AckWait           time.Duration
	MaxAckPending     int
	MemoryStorage     bool
	Replicas          int
	InactiveThreshold time.Duration
	// Start is the stream sequence of the first message (0 or 1: the stream's first) when
	// there is nothing else to go by: no Resume, nothing read yet and no durable consumer.
	Start uint64
	// StartTime, when set and Start is 0, begins at the first message stored at or after it
	// instead.
	StartTime *time.Time
	// Resume, when set, is asked at every (re)open for the stream sequence to read next: the
	// part's last processed message + 1 (a checkpoint). When it is nil or says 0, the Reader
	// resumes right after the last message it returned (right for a part that has processed
	// what it was handed, or waits in Resume until it has), or at first after the durable
	// consumer's ack floor, or at Start.
	Resume func(ctx context.Context) (uint64, error)
	// OnGap, when set, is told each time a run broke (a message lost in flight, a
	// redelivery, the consumer gone) and the consumer is recreated.
	OnGap func(reason string)
}

// Reader hands out a consumer's messages only as a contiguous run: each is the first
// delivery and its consumer sequence follows the last one returned. Anything else (a pull
// answer lost with a NATS node, a redelivery after AckWait, the consumer deleted or lost)
// breaks the run: what came after is discarded and the consumer is recreated at once at the
// position to resume from, instead of waiting AckWait for the server to redeliver.
//
// An ordered consumer is not used for the rebuilds: it deletes and recreates its consumer at
// every Fetch, and creating a filtered consumer makes the server count its pending messages,
// at a cost that grows with the stream.
type Reader struct {
	js    jetstream.JetStream
	spec  Spec
	next  uint64 // the stream sequence after the last message returned; 0 before any
	cons  jetstream.Consumer
	cseq  uint64 // the consumer sequence of the last message returned
	stale bool   // the run broke: recreate before the next fetch
	// lost: the connection was lost during a fetch; the next one checks the consumer first
	// (checkLoss) and keeps it when nothing went astray.
	lost bool
	idle *jetstream.ConsumerInfo
	// standIn: cons is an unnamed consumer read in place of the durable, whose own group had
	// no leader (standIn.go), since the time in standInSince.
	standIn      bool
	standInSince time.Time
	shared       atomic.Pointer[consumerRef] // cons, for other goroutines (Consumer)
}

type consumerRef struct{ jetstream.Consumer }

// New opens stream (filtered by filter, "" for all) at sequence start (0 or 1: the
// beginning), with a consumer of its own that acks nothing: the rebuilds' reader.
func New(ctx context.Context, js jetstream.JetStream, stream, filter string, start uint64) (*Reader, error) {
	return Open(ctx, js, Spec{
		Stream: stream, Filter: filter, AckPolicy: jetstream.AckNonePolicy, Start: start,
		InactiveThreshold: 5 * time.Minute, MemoryStorage: true, Replicas: 1,
	})
}

// Open creates spec's consumer at the position to resume from and returns its reader.
func Open(ctx context.Context, js jetstream.JetStream, spec Spec) (*Reader, error) {
	r := &Reader{js: js, spec: spec}
	if err := r.open(ctx); err != nil {
		return nil, err
	}
	return r, nil
}

// resumeAt is the stream sequence the (re)created consumer starts at.
func (r *Reader) resumeAt(ctx context.Context) (uint64, error) {
	if r.spec.Resume != nil {
		seq, err := r.spec.Resume(ctx)
		if err != nil {
			return 0, err
		}
		if seq > 0 {
			return seq, nil
		}
	}
	if r.next > 0 {
		return r.next, nil
	}
	if r.spec.Durable != "" {
		old, err := r.js.Consumer(ctx, r.spec.Stream, r.spec.Durable)
		switch {
		case err == nil:
			// A consumer's ack floor starts one before its first sequence, so this is right
			// for one that never acked too.
			if f := old.CachedInfo().AckFloor.Stream; f > 0 {
				return f + 1, nil
			}
		case !errors.Is(err, jetstream.ErrConsumerNotFound):
			return 0, fmt.Errorf("consumer %s: %w", r.spec.Durable, err)
		}
	}
	if r.spec.Start == 0 && r.spec.StartTime != nil {
		return 0, nil // by time
	}
	return max(r.spec.Start, 1), nil
}

func (r *Reader) open(ctx context.Context) error {
	start, err := r.resumeAt(ctx)
	if err != nil {
		return err
	}
	// Kept before the durable is deleted: should its creation fail, the next try starts
	// here, not from a consumer (and its ack floor) that is gone.
	r.next = start
	standIn := false
	if r.spec.Durable != "" {
		// A durable is recreated rather than updated: what it had delivered and not acked
		// (to a crashed predecessor, or lost in flight) comes at once, not after AckWait.
		var err error
		if standIn, err = r.deleteDurable(ctx); err != nil {
			return err
		}
	}
	if r.cons != nil && (r.spec.Durable == "" || r.standIn) {
		r.dropOwn(r.cons.CachedInfo().Name)
	}
	r.cons = nil
	cfg := jetstream.ConsumerConfig{
		Durable: r.spec.Durable, Description: r.spec.Description, FilterSubject: r.spec.Filter,
		AckPolicy: r.spec.AckPolicy, AckWait: r.spec.AckWait, MaxAckPending: r.spec.MaxAckPending,
		MaxDeliver: -1, DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: start,
		InactiveThreshold: r.spec.InactiveThreshold, MemoryStorage: r.spec.MemoryStorage, Replicas: r.spec.Replicas,
	}
	if start == 0 {
		cfg.DeliverPolicy, cfg.OptStartSeq, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, 0, r.spec.StartTime
	}
	if cfg.AckPolicy == jetstream.AckNonePolicy {
		cfg.MaxDeliver = 0
	}
	// The server counts a new filtered consumer's pending messages, which on a large and
	// busy stream can take longer than the API's default 5 s: a rebuild gives it time, and
	// retries. A part's durable fails sooner, to be tried again by the part, so that a request
	// lost while NATS restarts does not hold the partition.
	timeout, tries := openTimeout, 3
	if r.spec.Durable != "" {
		timeout, tries = durableOpenTimeout, 1
	}
	if standIn {
		cfg.Durable, cfg.InactiveThreshold = "", standInInactive
	}
	for range tries {
		actx, cancel := context.WithTimeout(ctx, timeout)
		var cons jetstream.Consumer
		cons, err = r.js.CreateConsumer(actx, r.spec.Stream, cfg)
		cancel()
		if err == nil {
			r.cons, r.cseq, r.next, r.stale, r.lost = cons, 0, start, false, false
			r.shared.Store(&consumerRef{cons})
			r.standIn = standIn
			if standIn {
				r.standInSince = time.Now()
			}
			return nil
		}
		if ctx.Err() != nil || !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, nats.ErrTimeout) {
			break
		}
	}
	return fmt.Errorf("%s consumer from seq %d: %w", r.spec.Stream, start, err)
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

// openTimeout bounds one attempt to create a rebuild reader's consumer, durableOpenTimeout
// a part's.
const (
	openTimeout        = time.Minute
	durableOpenTimeout = 5 * time.Second
)

// infoTimeout bounds the idle check of a consumer's state, which a healthy server answers in
// milliseconds; a pull that asks not to wait and takes noWaitUnanswered got no answer.
const (
	infoTimeout      = time.Second
	noWaitUnanswered = 900 * time.Millisecond
)

// Pending is the number of messages after the last one returned, as the consumer was
// created (exact then; md.NumPending of each message keeps it current).
func (r *Reader) Pending() uint64 {
	if r.cons == nil {
		return 0
	}
	return r.cons.CachedInfo().NumPending
}

// Info asks the server for the consumer's state, recreating the consumer when it is gone.
func (r *Reader) Info(ctx context.Context) (*jetstream.ConsumerInfo, error) {
	if r.cons == nil || r.stale {
		if err := r.open(ctx); err != nil {
			return nil, err
		}
	}
	info, err := r.cons.Info(ctx)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		if err := r.open(ctx); err != nil {
			return nil, err
		}
		return r.cons.Info(ctx)
	}
	return info, err
}

// Consumer is the consumer as last (re)created, nil before; safe to call from other
// goroutines, which should call it again for each use (a stand-in has another name).
func (r *Reader) Consumer() jetstream.Consumer {
	if c := r.shared.Load(); c != nil {
		return c.Consumer
	}
	return nil
}

// IdleInfo is the consumer's state as the last idle Fetch (nothing came within its wait)
// found it; nil before.
func (r *Reader) IdleInfo() *jetstream.ConsumerInfo { return r.idle }

// Reopen makes the next Fetch recreate the consumer at the position to resume from: a part
// whose processing of what it was handed failed calls it (with Resume set) to be handed the
// same messages again.
func (r *Reader) Reopen() { r.stale = true }

// Close deletes a reader's own consumer; a durable one stays for the next owner.
func (r *Reader) Close(ctx context.Context) {
	if r.cons != nil && r.spec.Durable == "" {
		_ = r.js.DeleteConsumer(context.WithoutCancel(ctx), r.spec.Stream, r.cons.CachedInfo().Name)
	} else if r.cons != nil && r.standIn {
		r.dropOwn(r.cons.CachedInfo().Name)
	}
	r.cons = nil
}

// Fetch returns up to n next messages in order: those at hand, or when wait > 0 those that
// come within wait. No message is returned twice (unless the reader was reopened at an
// earlier Resume position) or skipped. A broken run is repaired before Fetch returns: what
// was lost comes at once.
func (r *Reader) Fetch(ctx context.Context, n int, wait time.Duration) ([]jetstream.Msg, error) {
	msgs, gap, err := r.fetchOnce(ctx, n, wait)
	if err == nil && gap && len(msgs) == 0 {
		msgs, _, err = r.fetchOnce(ctx, n, wait)
	}
	return msgs, err
}

func (r *Reader) fetchOnce(pctx context.Context, n int, wait time.Duration) (_ []jetstream.Msg, gap bool, _ error) {
	// Requests end with the connection they went out on: their answers would never come.
	ctx, cancel := natsx.UntilLost(pctx, r.js.Conn())
	defer cancel()
	if r.cons != nil && !r.stale && r.lost {
		r.lost = false
		if reason := r.checkLoss(ctx); reason != "" {
			r.stale = true
			if r.spec.OnGap != nil {
				r.spec.OnGap(reason)
			}
		}
	}
	if r.backToDurable() {
		r.stale = true
	}
	if r.cons == nil || r.stale {
		if err := r.open(ctx); err != nil {
			return nil, false, err
		}
	}
	asked := time.Now()
	msgs, err := Drain(r.cons.FetchNoWait(n))
	// The server answers a pull that asks not to wait at once, if only to say there is
	// nothing; nats.go ends one that got no answer after a second, as if empty. No answer
	// means a consumer without a leader (or an answer lost): read again from a new one.
	unanswered := err == nil && len(msgs) == 0 && time.Since(asked) >= noWaitUnanswered
	if err == nil && len(msgs) == 0 && wait > 0 && !unanswered {
		fctx, cancel := context.WithTimeout(ctx, wait)
		msgs, err = Drain(r.cons.Fetch(1, jetstream.FetchContext(fctx)))
		cancel()
		if err == nil && len(msgs) == 1 && n > 1 {
			more, merr := Drain(r.cons.FetchNoWait(n - 1))
			msgs, err = append(msgs, more...), merr
		}
	}
	out, reason := r.takeRun(msgs)
	if unanswered {
		reason = "the consumer did not answer a pull (no leader?)"
	}
	switch {
	case err != nil && errors.Is(context.Cause(ctx), natsx.ErrConnLost):
		r.lost, err = true, nil
	case err != nil && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout)) && ctx.Err() == nil,
		err != nil && strings.Contains(err.Error(), "MaxAckPending"):
		// Nothing more now: the wait ran out, or the part holds as many as it may.
		err = nil
	case errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrConsumerDeleted) || errors.Is(err, jetstream.ErrNoHeartbeat) ||
		errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrConsumerLeadershipChanged) || errors.Is(err, jetstream.ErrServerShutdown):
		reason, err = "consumer gone: "+err.Error(), nil
	}
	if err == nil && reason == "" && len(msgs) == 0 && wait > 0 {
		reason, err = r.checkIdle(ctx)
	}
	if reason != "" {
		gap = true
		r.stale = true
		if r.spec.OnGap != nil {
			r.spec.OnGap(reason)
		}
	}
	if err != nil {
		r.stale = true
		return out, gap, fmt.Errorf("read %s: %w", r.spec.Stream, err)
	}
	return out, gap, nil
}

// checkLoss asks the consumer, after the connection was lost during a fetch, whether it
// delivered anything that did not arrive, and returns why the run broke, or "" to read on
// from it. Reading on needs only the consumer's leader; a new consumer needs the cluster's
// meta leader too, which may be the very node that went down.
func (r *Reader) checkLoss(ctx context.Context) string {
	ictx, cancel := context.WithTimeout(ctx, infoTimeout)
	info, err := r.cons.Info(ictx)
	cancel()
	switch {
	case err != nil:
		return "the NATS connection was lost, and the consumer did not answer after: " + err.Error()
	case info.Delivered.Consumer != r.cseq:
		return fmt.Sprintf("the NATS connection was lost with %d deliveries in flight", info.Delivered.Consumer-r.cseq)
	}
	return ""
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
