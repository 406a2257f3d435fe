package bridge

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/lock-sensors/lock-sensors/internal/crashpoint"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
)

// CrashAfterPublish is the crash point between JetStream's ack of an append and the AMQP ack.
const CrashAfterPublish = "bridge.after_publish"

// acker resolves items in delivery order and acks RabbitMQ after each effect is durable,
// several at a time with multiple=true. After fail it only drains.
func (b *Bridge) acker(ctx context.Context, ch *amqp.Channel, sess *session, pending <-chan item, returns <-chan amqp.Return, fail func(error)) {
	w := &ackWindow{b: b, ctx: ctx, ch: ch, sess: sess, fail: fail}
	flush := w.flush
	batch := max(1, b.cfg.Prefetch/4)
	// An idle acker still keeps its session's record alive (see identity.go).
	tick := time.NewTicker(heartbeatEvery)
	defer tick.Stop()
	wait := func() (item, bool) {
		for {
			select {
			case it, ok := <-pending:
				return it, ok
			case <-tick.C:
				sess.heartbeat(ctx)
			}
		}
	}
	for {
		var it item
		var ok bool
		select {
		case it, ok = <-pending:
		default:
			flush() // nothing more to resolve right now
			it, ok = wait()
		}
		if !ok {
			break
		}
		b.m.inFlight.Dec()
		if w.failed {
			endAppend(it, errSessionFailed)
			if it.done != nil {
				close(it.done)
			}
			continue
		}
		err := b.resolve(ctx, it, returns, flush)
		endAppend(it, err)
		if err != nil {
			flush()     // what came before is done: ack it
			w.stop(err) // before done is closed: the reader must see the failure first
		}
		if it.done != nil {
			close(it.done)
		}
		if err != nil {
			continue
		}
		w.lastTag, w.lastStart = it.tag, it.start
		w.unacked++
		if w.unacked >= batch {
			flush()
		}
	}
	flush()
}

// ackWindow is what the acker has resolved and not yet acked: one ack of lastTag with
// multiple=true covers all unacked of them. Once failed, it acks nothing more.
type ackWindow struct {
	b         *Bridge
	ctx       context.Context
	ch        *amqp.Channel
	sess      *session
	fail      func(error)
	lastTag   uint64
	lastStart time.Time
	unacked   int
	failed    bool
}

// flush acks the window, if there is anything to ack.
func (w *ackWindow) flush() {
	if w.unacked == 0 || w.failed {
		return
	}
	// Recorded before the ack, so a later session never takes an acked reading for an
	// unacked one (see identity.go).
	if err := w.b.recordSession(w.ctx, w.sess, w.lastTag, w.lastStart); err != nil {
		w.stop(err)
		return
	}
	if err := w.ch.Ack(w.lastTag, true); err != nil {
		w.stop(fmt.Errorf("ack: %w", err))
		return
	}
	w.unacked = 0
	w.sess.heartbeat(w.ctx)
}

// stop fails the session with err; the window acks nothing after it.
func (w *ackWindow) stop(err error) {
	w.failed = true
	w.fail(err)
}

// resolve waits until the item's effect is durable. Before it blocks, it calls idle: acks
// go out as soon as the pipeline would wait anyway, so RabbitMQ's window never sits full of
// messages that are already done.
func (b *Bridge) resolve(ctx context.Context, it item, returns <-chan amqp.Return, idle func()) error {
	if it.reason != "" {
		if it.pubErr != nil {
			return fmt.Errorf("publish to %s: %w", b.cfg.InvalidQueue, it.pubErr)
		}
		select {
		case <-it.confirm.Done():
		default:
			idle()
			select {
			case <-it.confirm.Done():
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		if !it.confirm.Acked() {
			return fmt.Errorf("RabbitMQ did not confirm the publish to %s", b.cfg.InvalidQueue)
		}
		// RabbitMQ sends basic.return before the confirm, and amqp091-go hands it to this
		// buffered channel before it reads the confirm: a returned (unroutable) message,
		// e.g. the invalid queue deleted under us, is seen here, never acked as stored.
		select {
		case r, ok := <-returns:
			if !ok {
				return errors.New("RabbitMQ channel closed")
			}
			return fmt.Errorf("publish to %s returned: %d %s", b.cfg.InvalidQueue, r.ReplyCode, r.ReplyText)
		default:
		}
		b.m.invalid.WithLabelValues(it.reason).Inc()
		return nil
	}
	if it.dup {
		b.m.duplicates.Inc()
		b.m.accepted.Inc()
		return nil
	}
	if it.msg == nil {
		return it.pubErr
	}
	var ack *jetstream.PubAck
	err := it.pubErr
	if err == nil {
		select {
		case ack = <-it.future.Ok():
		case err = <-it.future.Err():
		default:
			idle()
			select {
			case ack = <-it.future.Ok():
			case err = <-it.future.Err():
			case <-it.lost:
				// Its ack went to the lost connection: retried now, not after PublishTimeout.
				err = natsx.ErrConnLost
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	retried := err != nil
	if retried {
		ack, err = b.republish(ctx, it.msg, err)
		if err != nil {
			return err
		}
	}
	b.m.latency.Observe(time.Since(it.start).Seconds())
	b.m.appendStage.Since(it.start)
	if ack.Duplicate && !(retried && b.ownAppend(ctx, ack, it.msg)) {
		b.m.duplicates.Inc()
	}
	crashpoint.Hit(CrashAfterPublish)
	b.m.accepted.Inc()
	return nil
}

// ownAppend tells whether the message a retried append was reported a duplicate of is this
// very append's first attempt, which JetStream stored although its ack was lost (a NATS
// failover): then the reading was recorded now, not before, and is not counted as a
// duplicate. Unsure (the look-up failed) counts it as a duplicate, as before.
func (b *Bridge) ownAppend(ctx context.Context, ack *jetstream.PubAck, msg *nats.Msg) bool {
	if strings.HasPrefix(msg.Header.Get(jetstream.MsgIDHeader), "o:") {
		return true // the id is this delivery's alone (natsMsgID): nothing else can hold it
	}
	gctx, cancel := context.WithTimeout(ctx, b.cfg.PublishTimeout)
	defer cancel()
	s, err := b.js.Stream(gctx, natsx.ReadingsStream)
	if err != nil {
		return false
	}
	stored, err := s.GetMsg(gctx, ack.Sequence)
	return err == nil && bytes.Equal(stored.Data, msg.Data)
}
