package logread

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/lock-sensors/lock-sensors/internal/natsx"
)

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
	if err := r.prepare(ctx); err != nil {
		return nil, false, err
	}
	msgs, unanswered, err := r.pull(ctx, n, wait)
	reason := ""
	if unanswered {
		reason = "the consumer did not answer a pull (no leader?)"
	}
	out, broke := r.contiguous(msgs)
	if broke != "" {
		reason = broke
	}
	why, err := r.classify(ctx, err)
	if why != "" {
		reason = why
	}
	if err == nil && reason == "" && len(msgs) == 0 && wait > 0 {
		reason, err = r.idleCheck(ctx)
	}
	if reason != "" {
		gap = true
		r.broke(reason)
	}
	if err != nil {
		r.stale = true
		return out, gap, fmt.Errorf("read %s: %w", r.spec.Stream, err)
	}
	return out, gap, nil
}

// prepare checks the consumer after a lost connection, goes back to the durable when a
// stand-in's time is up, and (re)creates the consumer when the run broke.
func (r *Reader) prepare(ctx context.Context) error {
	if r.cons != nil && !r.stale && r.lost {
		r.lost = false
		if reason := r.checkLoss(ctx); reason != "" {
			r.broke(reason)
		}
	}
	if r.backToDurable() {
		r.stale = true
	}
	if r.cons == nil || r.stale {
		return r.open(ctx)
	}
	return nil
}

// broke marks the run broken for reason: the consumer is recreated before the next pull.
func (r *Reader) broke(reason string) {
	r.stale = true
	if r.spec.OnGap != nil {
		r.spec.OnGap(reason)
	}
}

// pull asks for what is at hand, and when nothing is and wait > 0, waits up to wait for one
// message and takes what is pending behind it. unanswered says the first pull got no answer.
func (r *Reader) pull(ctx context.Context, n int, wait time.Duration) (msgs []jetstream.Msg, unanswered bool, err error) {
	asked := time.Now()
	msgs, err = Drain(r.cons.FetchNoWait(ask(n, r.pending)))
	// The server answers a pull that asks not to wait at once, if only to say there is
	// nothing; nats.go ends one that got no answer after a second, as if empty. No answer
	// means a consumer without a leader (or an answer lost): read again from a new one.
	unanswered = err == nil && len(msgs) == 0 && time.Since(asked) >= noWaitUnanswered
	if err == nil && len(msgs) == 0 && wait > 0 && !unanswered {
		var b jetstream.MessageBatch
		if b, err = r.cons.Fetch(1, jetstream.FetchMaxWait(wait)); err == nil {
			msgs, err = r.drainUntil(ctx, b)
		}
		if md, merr := firstMeta(msgs); err == nil && merr == nil && md.NumPending > 0 && n > 1 {
			more, merr := Drain(r.cons.FetchNoWait(ask(n-1, md.NumPending)))
			msgs, err = append(msgs, more...), merr
		}
	}
	return msgs, unanswered, err
}

// contiguous keeps the run of msgs that follows the last message returned: first deliveries
// in consumer sequence. It returns why the run broke after them, "" when it did not.
func (r *Reader) contiguous(msgs []jetstream.Msg) (out []jetstream.Msg, reason string) {
	out = msgs[:0]
	for _, m := range msgs {
		md, err := m.Metadata()
		switch {
		case err != nil:
			return out, "unreadable metadata"
		case md.Sequence.Consumer != r.cseq+1:
			return out, fmt.Sprintf("consumer sequence %d after %d: a delivery was lost", md.Sequence.Consumer, r.cseq)
		case md.NumDelivered != 1 && r.spec.AckPolicy != jetstream.AckNonePolicy:
			return out, "redelivery"
		}
		r.cseq, r.next, r.pending = md.Sequence.Consumer, md.Sequence.Stream+1, md.NumPending
		out = append(out, m)
	}
	return out, ""
}

// classify sorts a pull's error: the connection lost (checked at the next fetch), nothing
// more for now, or the consumer gone (a reason to recreate it); any other error is returned
// as it is.
func (r *Reader) classify(ctx context.Context, err error) (reason string, rest error) {
	switch {
	case err != nil && errors.Is(context.Cause(ctx), natsx.ErrConnLost):
		r.lost = true
		return "", nil
	case err != nil && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout)) && ctx.Err() == nil,
		err != nil && strings.Contains(err.Error(), "MaxAckPending"):
		// Nothing more now: the wait ran out, or the part holds as many as it may.
		return "", nil
	case errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrConsumerDeleted) || errors.Is(err, jetstream.ErrNoHeartbeat) ||
		errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrConsumerLeadershipChanged) || errors.Is(err, jetstream.ErrServerShutdown):
		return "consumer gone: " + err.Error(), nil
	}
	return "", err
}

// idleCheck asks an idle consumer how many messages it delivered: a message lost at the tail
// has no successor to show the gap, the consumer's count of deliveries does. Bounded: a
// consumer whose leader went down with a NATS node answers nothing until it has a new one
// (seconds to minutes), and waiting the API's default 5 s for it held the part that long; a
// new consumer reads at once.
func (r *Reader) idleCheck(ctx context.Context) (reason string, err error) {
	ictx, cancel := context.WithTimeout(ctx, infoTimeout)
	info, ierr := r.cons.Info(ictx)
	cancel()
	r.idle = info
	if ierr == nil {
		r.pending = info.NumPending
	}
	switch {
	case errors.Is(ierr, jetstream.ErrConsumerNotFound):
		return "consumer gone", nil
	case ierr != nil && ctx.Err() == nil && (errors.Is(ierr, context.DeadlineExceeded) || errors.Is(ierr, nats.ErrTimeout)):
		return "the consumer did not answer within " + infoTimeout.String() + " (no leader?)", nil
	case ierr != nil && errors.Is(context.Cause(ctx), natsx.ErrConnLost):
		r.lost = true
		return "", nil
	case ierr != nil:
		return "", ierr
	case info.Delivered.Consumer > r.cseq:
		return fmt.Sprintf("consumer delivered %d, %d came: a delivery was lost", info.Delivered.Consumer, r.cseq), nil
	}
	return "", nil
}

// pullSlack is what a pull asks for beyond what the consumer was known to have pending: what
// came since.
const pullSlack = 64

// ask is the batch of a pull for up to n messages when pending were known to be left: nats.go
// allocates a pull's buffers by its batch, so a part with a large batch (thousands) that asks
// for all of it at every pull at a low rate spends its CPU clearing buffers. What a smaller
// ask leaves comes with the next pull, at once.
func ask(n int, pending uint64) int {
	return int(min(uint64(n), pending+pullSlack))
}

// firstMeta is the metadata of msgs[0] (an error when there is none).
func firstMeta(msgs []jetstream.Msg) (*jetstream.MsgMetadata, error) {
	if len(msgs) == 0 {
		return nil, errors.New("no message")
	}
	return msgs[0].Metadata()
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

// drainUntil collects a batch fetched with FetchMaxWait, or what came of it until ctx is
// done. Such a pull ends with the server's own end-of-pull status, which comes after any
// message it sent, so a message sent as the wait runs out is never lost to a pull the client
// gave up first (as with a context's deadline, which left a busy machine a ninth of the wait
// to read it). A pull left when ctx ends may still deliver: the run is checked before the
// next one (checkLoss).
func (r *Reader) drainUntil(ctx context.Context, b jetstream.MessageBatch) ([]jetstream.Msg, error) {
	out, err := drain(ctx.Done(), b)
	if ctx.Err() != nil {
		r.lost = true
		return out, ctx.Err()
	}
	return out, err
}

// Drain collects a fetched batch; the end of the messages (ErrNoMessages) is no error.
func Drain(b jetstream.MessageBatch, err error) ([]jetstream.Msg, error) {
	if err != nil {
		return nil, err
	}
	return drain(nil, b)
}

// drain collects b's messages until the batch ends or stop is closed (nil: never).
func drain(stop <-chan struct{}, b jetstream.MessageBatch) ([]jetstream.Msg, error) {
	var out []jetstream.Msg
	for {
		select {
		case m, ok := <-b.Messages():
			if !ok {
				if err := b.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
					return out, err
				}
				return out, nil
			}
			out = append(out, m)
		case <-stop:
			return out, nil
		}
	}
}
