package state

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/partition"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// A relay that starts with rows left in the outbox looks up each sensor's last event in
// EVENTS to skip what is already there. Anyone can publish to EVENTS: a garbage last message
// must not wedge the relay, and a forged one with a huge (2^62) or merely ahead-of-state
// revision must not make the real row look published and be deleted unsent.
func TestRelayIgnoresForgedLastEvents(t *testing.T) {
	t.Parallel()
	e := newStateEnv(t, 4)
	ctx := t.Context()
	ev := func(sensor string, rev int64) event.Event {
		one := uint8(1)
		return event.Event{V: event.Version, ID: event.ID(sensor, rev), Type: event.TypeStateChanged, OccurredAt: time.Now().UTC(),
			SensorID: sensor, Data: 0, PreviousData: &one, Revision: rev, Partition: partition.Of(sensor, e.n)}
	}
	forged := map[string][]byte{
		"garbage": []byte("\x00not an event"),
		"huge":    mustJSON(t, ev("huge", 1<<62)),
		"ahead":   mustJSON(t, ev("ahead", 3)), // sane, but the state is at revision 2
	}
	for sensor, body := range forged {
		p := partition.Of(sensor, e.n)
		// The real revision 1 was relayed; revision 2 is committed with the state and still
		// in the outbox (the relay stopped before publishing it); then the forgery came.
		if _, err := e.nats.JS.Publish(ctx, natsx.EventsSubject(p, sensor), mustJSON(t, ev(sensor, 1)), jetstream.WithMsgID(event.ID(sensor, 1))); err != nil {
			t.Fatal(err)
		}
		if _, err := e.nats.JS.Publish(ctx, natsx.EventsSubject(p, sensor), body); err != nil {
			t.Fatal(err)
		}
		if _, err := e.pg.Exec(ctx, `INSERT INTO sensor_state (sensor_id, partition, data, last_seen, last_reading_time, changed_at, revision, connection, last_seq)
			VALUES ($1, $2, 0, now(), now(), now(), 2, 'online', 0)`, sensor, p); err != nil {
			t.Fatal(err)
		}
		if _, err := e.pg.Exec(ctx, `INSERT INTO outbox (event_id, partition, sensor_id, revision, payload) VALUES ($1, $2, $3, 2, $4)`,
			event.ID(sensor, 2), p, sensor, mustJSON(t, ev(sensor, 2))); err != nil {
			t.Fatal(err)
		}
	}
	e.runState(t, e.nats.JS, partition.All(e.n))
	st, err := e.nats.JS.Stream(ctx, natsx.EventsStream)
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, "the outbox relayed", func() bool {
		var n int
		return e.pg.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&n) == nil && n == 0
	})
	for sensor := range forged {
		m, err := st.GetLastMsgForSubject(ctx, natsx.EventsSubject(partition.Of(sensor, e.n), sensor))
		if err != nil {
			t.Fatal(err)
		}
		got, err := event.DecodeEvent(m.Data)
		if err != nil || got.ID != event.ID(sensor, 2) {
			t.Errorf("%s: last event in EVENTS is %q (%v), want the real revision 2 published after the forgery", sensor, m.Data, err)
		}
	}
}

func mustJSON(t testing.TB, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
