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
	var (
		lastTag   uint64
		lastStart time.Time
		unacked   int
		failed    bool
	)
	batch := max(1, b.cfg.Prefetch/4)
	flush := func() {
		if unacked == 0 || failed {
			return
		}
		// Recorded before the ack, so a later session never takes an acked reading for an
		// unacked one (see identity.go).
		if err := b.recordSession(ctx, sess, lastTag, lastStart); err != nil {
			failed = true
			fail(err)
			return
		}
		if err := ch.Ack(lastTag, true); err != nil {
			failed = true
			fail(fmt.Errorf("ack: %w", err))
			return
		}
		unacked = 0
		sess.heartbeat(ctx)
	}
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
		if failed {
			endAppend(it, errSessionFailed)
			if it.done != nil {
				close(it.done)
			}
			continue
		}
		err := b.resolve(ctx, it, returns, flush)
		endAppend(it, err)
		if err != nil {
			flush() // what came before is done: ack it
			failed = true
			fail(err) // before done is closed: the reader must see the failure first
		}
		if it.done != nil {
			close(it.done)
		}
		if err != nil {
			continue
		}
		lastTag, lastStart = it.tag, it.start
		unacked++
		if unacked >= batch {
			flush()
		}
	}
	flush()
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
