package watchdog

import (
	"context"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/lock-sensors/lock-sensors/internal/crashpoint"
)

const (
	// appendedQueue is how many facts may wait for their ack before settling pauses.
	appendedQueue = 4096
	// factAckWait bounds the wait for one fact's ack; past it the expiry is settled again
	// (the fact's Nats-Msg-Id makes a second append of it harmless).
	factAckWait = 30 * time.Second
)

// appended is a liveness_timeout fact on its way into READINGS, and what settle knew.
type appended struct {
	fut       jetstream.PubAckFuture
	sensor    string
	c         candidate
	received  time.Time // receive time of the sensor's last reading
	lastSeq   uint64    // its READINGS sequence
	lostAfter time.Duration
	at        time.Time // the fact's time
	expect    []jetstream.PublishOpt
}

// finishFacts waits for each appended fact's ack, in order, and then does what follows a
// stored fact (factStored); a fact that failed goes back to the held expiries.
func (w *Watchdog) finishFacts(ctx context.Context) error {
	for {
		var a appended
		select {
		case <-ctx.Done():
			return nil
		case a = <-w.appended:
		}
		t := time.NewTimer(factAckWait)
		select {
		case <-a.fut.Ok():
			w.factStored(ctx, a)
		case err := <-a.fut.Err():
			w.log.Warn("append liveness_timeout failed; will settle it again", "sensor", a.sensor, "err", err)
			w.requeue(a.sensor, a.c)
		case <-t.C:
			w.log.Warn("append liveness_timeout not acknowledged; will settle it again", "sensor", a.sensor, "waited", factAckWait)
			w.requeue(a.sensor, a.c)
		case <-ctx.Done():
			t.Stop()
			return nil
		}
		t.Stop()
	}
}

// factStored counts a stored fact, forgets the sensor's refresh deadline and marks its key
// declared.
func (w *Watchdog) factStored(ctx context.Context, a appended) {
	w.m.facts.Inc()
	if a.c.overdue {
		w.m.declaredAtMaxHold.Inc()
		w.log.Warn("sensor declared lost despite the pipeline lag: its expiry was held for max_hold",
			"sensor", a.sensor, "held_for", a.at.Sub(a.c.heldSince).Round(time.Millisecond), "max_hold", w.cfg.MaxHold, "last_reading", a.received)
	}
	w.forget(a.sensor)
	deadline := a.received.Add(a.lostAfter)
	w.m.delay.Observe(a.at.Sub(deadline).Seconds())
	if !a.c.at.IsZero() {
		w.m.markerLag.Observe(a.c.at.Sub(deadline).Seconds())
	}
	crashpoint.Hit("watchdog.after_fact")
	// Marking the key only spares a restart from settling this expiry again (which would
	// find the fact as the sensor's last message and append nothing): no need to wait.
	put := &nats.Msg{Subject: w.kvSubject(a.sensor), Data: encodeValue(a.received, a.lastSeq, true), Header: nats.Header{}}
	if _, err := w.js.PublishMsgAsync(put, a.expect...); err != nil {
		_, err = w.js.PublishMsg(ctx, put, a.expect...)
		if err != nil && !isWrongLastSeq(err) && ctx.Err() == nil {
			w.log.Warn("mark key declared", "sensor", a.sensor, "err", err)
		}
	}
}
