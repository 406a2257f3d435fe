package watchdog

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/lock-sensors/lock-sensors/internal/crashpoint"
	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/partition"
)

// factAckWait bounds the wait for a fact's acknowledgement.
const factAckWait = 10 * time.Second

// errFactAckTimeout is a fact whose acknowledgement did not come within factAckWait.
var errFactAckTimeout = errors.New("no acknowledgement within " + factAckWait.String())

// FactMsgID is the Nats-Msg-Id of the liveness_timeout fact that follows the reading at
// READINGS sequence seq: the same expiry appended twice is stored once.
func FactMsgID(sensor string, seq uint64) string {
	return "liveness:" + sensor + ":" + strconv.FormatUint(seq, 10)
}

// settleDeferred decides one expiry from the sensor's last message in READINGS: nothing
// when it already is a liveness_timeout (the key is marked), a refresh with the time left
// when it is a reading younger than lost_after, the fact otherwise. It returns the key's
// declared mark for the caller to write when it has time (see writeMark).
func (w *Watchdog) settleDeferred(ctx context.Context, readings jetstream.Stream, sensor string, c candidate) (*declaredMark, error) {
	p := partition.Of(sensor, w.cfg.PartitionCount)
	last, err := readings.GetLastMsgForSubject(ctx, natsx.ReadingsStoredSubject(p, sensor))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, nil // nothing was ever read from it: nothing to declare
	}
	if err != nil {
		return nil, fmt.Errorf("last READINGS message of %s: %w", sensor, err)
	}
	return w.decide(ctx, sensor, c, last)
}

// verdict is what an expiry comes to (judge).
type verdict int

const (
	// silent: no reading for lost_after; the liveness_timeout fact is appended.
	silent verdict = iota
	// stillAlive: the last reading is younger than lost_after (the key expired because the
	// watchdog was behind); the key is refreshed for the time left.
	stillAlive
	// alreadyDeclared: the last message is a liveness_timeout; the key is marked declared.
	alreadyDeclared
)

// judge decides an expiry from the sensor's last message in READINGS, its lost_after and
// the time now; left is the time left when the sensor is still alive.
func judge(last event.Log, lostAfter time.Duration, now time.Time) (v verdict, left time.Duration) {
	if last.Kind == event.KindLivenessTimeout {
		return alreadyDeclared, 0
	}
	if left := lostAfter - now.Sub(last.ReceivedTime); left > 0 {
		return stillAlive, left
	}
	return silent, 0
}

// decide settles one expiry given last, the sensor's last message in READINGS (read after
// the expiry); see settleDeferred.
func (w *Watchdog) decide(ctx context.Context, sensor string, c candidate, last *jetstream.RawStreamMsg) (_ *declaredMark, err error) {
	p := partition.Of(sensor, w.cfg.PartitionCount)
	if !w.mayAct(p) {
		return nil, nil // p's new owner settles it, from the marker its watch replays
	}
	l, err := event.CheckLog(last.Subject, last.Data, w.cfg.PartitionCount)
	if err != nil {
		// A forged or malformed last message (set aside by the consumers) must not hide the
		// sensor's silence for ever: it counts as nothing more than a message stored then.
		l = event.Log{Kind: event.KindReading, SensorID: sensor, ReceivedTime: last.Time}
	}
	expect := []jetstream.PublishOpt{}
	if c.expect {
		expect = append(expect, jetstream.WithExpectLastSequencePerSubject(c.rev))
	}
	lostAfter := w.lostAfter(sensor)
	now := w.clock.Now()
	v, left := judge(l, lostAfter, now)
	switch v {
	case alreadyDeclared:
		w.m.alreadyDeclared.Inc()
		// Declared before (e.g. we stopped before marking the key): mark it now.
		return nil, w.markDeclared(ctx, sensor, last, expect)
	case stillAlive:
		// A reading younger than lost_after: the key expired because we were behind.
		w.m.refreshedOnCheck.Inc()
		_, err := w.js.PublishMsg(ctx, &nats.Msg{Subject: w.kvSubject(sensor), Data: encodeValue(l.ReceivedTime, last.Sequence, false), Header: nats.Header{}},
			append(expect, jetstream.WithMsgTTL(ttlFor(left)))...)
		if isWrongLastSeq(err) {
			return nil, nil // refreshed meanwhile
		}
		if err != nil {
			return nil, fmt.Errorf("refresh %s: %w", sensor, err)
		}
		return nil, nil
	}
	fact := event.Log{V: event.Version, Kind: event.KindLivenessTimeout, SensorID: sensor, ReceivedTime: now.UTC(), LostAfter: lostAfter}
	body, err := jsonFact(fact)
	if err != nil {
		return nil, err
	}
	h := nats.Header{}
	if w.tracer != nil {
		span := w.startLost(ctx, sensor, last, h)
		defer func() { endLost(span, err) }()
	}
	if err = w.appendFact(ctx, natsx.ReadingsSubject(sensor), body, h, FactMsgID(sensor, last.Sequence)); err != nil {
		return nil, fmt.Errorf("append liveness_timeout of %s: %w", sensor, err)
	}
	w.m.facts.Inc()
	if c.overdue {
		w.m.declaredAtMaxHold.Inc()
		w.log.Warn("sensor declared lost despite the pipeline lag: its expiry was held for max_hold",
			"sensor", sensor, "held_for", now.Sub(c.heldSince).Round(time.Millisecond), "max_hold", w.cfg.MaxHold, "last_reading", l.ReceivedTime)
	}
	w.forget(sensor)
	w.m.delay.Observe(now.Sub(l.ReceivedTime.Add(lostAfter)).Seconds())
	if !c.at.IsZero() {
		w.m.markerLag.Observe(c.at.Sub(l.ReceivedTime.Add(lostAfter)).Seconds())
	}
	crashpoint.Hit("watchdog.after_fact")
	return &declaredMark{sensor: sensor, received: l.ReceivedTime, seq: last.Sequence, rev: c.rev, expect: c.expect}, nil
}

// appendFact appends a liveness_timeout to READINGS and waits for its acknowledgement. It
// publishes asynchronously, so that the settles running at once share the connection's
// pipeline of acks instead of making a request each; one that cannot be started that way
// (too many acks pending) is published synchronously.
func (w *Watchdog) appendFact(ctx context.Context, subject string, body []byte, h nats.Header, msgID string) error {
	fut, err := w.js.PublishMsgAsync(&nats.Msg{Subject: subject, Data: body, Header: h}, jetstream.WithMsgID(msgID))
	if err != nil {
		_, err = w.js.PublishMsg(ctx, &nats.Msg{Subject: subject, Data: body, Header: h}, jetstream.WithMsgID(msgID))
		return err
	}
	// An ack lost without a disconnect (which fails the future) must not stall this worker
	// for ever: the expiry is retried, and the fact's Nats-Msg-Id keeps it single.
	t := time.NewTimer(factAckWait)
	defer t.Stop()
	select {
	case <-fut.Ok():
		return nil
	case err := <-fut.Err():
		return err
	case <-t.C:
		return errFactAckTimeout
	case <-ctx.Done():
		return ctx.Err()
	}
}

// markDeclared writes the declared value (no TTL) over the sensor's key, unless the key
// changed since the expiry.
func (w *Watchdog) markDeclared(ctx context.Context, sensor string, last *jetstream.RawStreamMsg, expect []jetstream.PublishOpt) error {
	received := last.Time
	if l, err := event.DecodeLog(last.Data); err == nil && l.Kind == event.KindReading {
		received = l.ReceivedTime
	}
	_, err := w.js.PublishMsg(ctx, &nats.Msg{Subject: w.kvSubject(sensor), Data: encodeValue(received, last.Sequence, true), Header: nats.Header{}}, expect...)
	if err != nil && !isWrongLastSeq(err) {
		return fmt.Errorf("mark %s declared: %w", sensor, err)
	}
	return nil
}

// isWrongLastSeq says a conditional write found the key changed since the expiry.
func isWrongLastSeq(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

func jsonFact(l event.Log) ([]byte, error) {
	b, err := json.Marshal(l)
	if err != nil {
		return nil, fmt.Errorf("encode liveness_timeout: %w", err)
	}
	return b, nil
}
