package logread

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/lock-sensors/lock-sensors/internal/natsx"
)

// The checks by which fetchOnce finds where a run of messages breaks.

// takeRun keeps the messages of msgs, in place, up to the first that does not continue the
// run (the next consumer sequence, delivered the first time), moving the reader's position
// past each kept one, and returns why it stopped short, or "" when it kept them all.
func (r *Reader) takeRun(msgs []jetstream.Msg) (out []jetstream.Msg, reason string) {
	out = msgs[:0]
	for _, m := range msgs {
		md, merr := m.Metadata()
		switch {
		case merr != nil:
			reason = "unreadable metadata"
		case md.Sequence.Consumer != r.cseq+1:
			reason = fmt.Sprintf("consumer sequence %d after %d: a delivery was lost", md.Sequence.Consumer, r.cseq)
		case md.NumDelivered != 1 && r.spec.AckPolicy != jetstream.AckNonePolicy:
			reason = "redelivery"
		}
		if reason != "" {
			break
		}
		r.cseq, r.next = md.Sequence.Consumer, md.Sequence.Stream+1
		out = append(out, m)
	}
	return out, reason
}

// checkIdle asks the consumer, after a fetch that waited and got nothing, whether it
// delivered anything that did not arrive, and returns why the run broke, or "" and nil to
// read on. A message lost at the tail has no successor to show the gap: the consumer's
// count of deliveries does.
func (r *Reader) checkIdle(ctx context.Context) (reason string, err error) {
	// Bounded: a consumer whose leader went down with a NATS node answers nothing until
	// it has a new one (seconds to minutes), and waiting the API's default 5 s for it
	// held the part that long; a new consumer reads at once.
	ictx, icancel := context.WithTimeout(ctx, infoTimeout)
	info, ierr := r.cons.Info(ictx)
	icancel()
	r.idle = info
	switch {
	case errors.Is(ierr, jetstream.ErrConsumerNotFound):
		return "consumer gone", nil
	case ierr != nil && ctx.Err() == nil && (errors.Is(ierr, context.DeadlineExceeded) || errors.Is(ierr, nats.ErrTimeout)):
		return "the consumer did not answer within " + infoTimeout.String() + " (no leader?)", nil
	case ierr != nil && errors.Is(context.Cause(ctx), natsx.ErrConnLost):
		r.lost = true
	case ierr != nil:
		return "", ierr
	case info.Delivered.Consumer > r.cseq:
		return fmt.Sprintf("consumer delivered %d, %d came: a delivery was lost", info.Delivered.Consumer, r.cseq), nil
	}
	return "", nil
}
