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

// FactMsgID is the Nats-Msg-Id of the liveness_timeout fact that follows the reading at
// READINGS sequence seq: the same expiry appended twice is stored once.
func FactMsgID(sensor string, seq uint64) string {
	return "liveness:" + sensor + ":" + strconv.FormatUint(seq, 10)
}

// settle decides one expiry from the sensor's last message in READINGS: nothing when it
// already is a liveness_timeout (the key is marked), a refresh with the time left when it is
// a reading younger than lost_after, the fact otherwise.
func (w *Watchdog) settle(ctx context.Context, readings jetstream.Stream, sensor string, c candidate) error {
	p := partition.Of(sensor, w.cfg.PartitionCount)
	last, err := readings.GetLastMsgForSubject(ctx, natsx.ReadingsStoredSubject(p, sensor))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil // nothing was ever read from it: nothing to declare
	}
	if err != nil {
		return fmt.Errorf("last READINGS message of %s: %w", sensor, err)
	}
	if !w.mayAct(p) {
		return nil // p's new owner settles it, from the marker its watch replays
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
	if l.Kind == event.KindLivenessTimeout {
		w.m.alreadyDeclared.Inc()
		// Declared before (e.g. we stopped before marking the key): mark it now.
		return w.markDeclared(ctx, sensor, last, expect)
	}
	lostAfter := w.lostAfter(sensor)
	now := time.Now()
	if left := lostAfter - now.Sub(l.ReceivedTime); left > 0 {
		// A reading younger than lost_after: the key expired because we were behind.
		w.m.refreshedOnCheck.Inc()
		_, err := w.js.PublishMsg(ctx, &nats.Msg{Subject: w.kvSubject(sensor), Data: encodeValue(l.ReceivedTime, last.Sequence, false), Header: nats.Header{}},
			append(expect, jetstream.WithMsgTTL(ttlFor(left)))...)
		if isWrongLastSeq(err) {
			return nil // refreshed meanwhile
		}
		if err != nil {
			return fmt.Errorf("refresh %s: %w", sensor, err)
		}
		return nil
	}
	fact := event.Log{V: event.Version, Kind: event.KindLivenessTimeout, SensorID: sensor, ReceivedTime: now.UTC(), LostAfter: lostAfter}
	body, err := jsonFact(fact)
	if err != nil {
		return err
	}
	if _, err := w.js.PublishMsg(ctx, &nats.Msg{Subject: natsx.ReadingsSubject(sensor), Data: body, Header: nats.Header{}},
		jetstream.WithMsgID(FactMsgID(sensor, last.Sequence))); err != nil {
		return fmt.Errorf("append liveness_timeout of %s: %w", sensor, err)
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
	// Marking the key only spares a restart from settling this expiry again (which would
	// find the fact as the sensor's last message and append nothing): no need to wait.
	put := &nats.Msg{Subject: w.kvSubject(sensor), Data: encodeValue(l.ReceivedTime, last.Sequence, true), Header: nats.Header{}}
	if _, err := w.js.PublishMsgAsync(put, expect...); err != nil {
		return w.markDeclared(ctx, sensor, last, expect)
	}
	return nil
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
