package state

import (
	"testing"
	"time"

	"github.com/lock-sensors/lock-sensors/internal/event"
)

// step, the whole decision of the state projector, as a table: no server.
func TestStep(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	reading := func(data uint8, at time.Time) event.Log {
		return event.Log{V: event.Version, Kind: event.KindReading, SensorID: "s1", Data: data, Time: at, ReceivedTime: at}
	}
	timeout := func(at time.Time, after time.Duration) event.Log {
		return event.Log{V: event.Version, Kind: event.KindLivenessTimeout, SensorID: "s1", ReceivedTime: at, LostAfter: after}
	}
	untracked := func(data uint8, at time.Time) event.Log {
		l := reading(data, at)
		l.Untracked = true
		return l
	}
	one := uint8(1)
	online := row{data: 1, lastSeen: t0, lastReadingTime: t0, changedAt: t0, revision: 4, lastSeq: 9}
	lost := online
	lost.lost = true
	type ev struct {
		typ  string
		data uint8
		prev *uint8
	}
	for _, c := range []struct {
		name    string
		cur     row
		ok      bool
		l       event.Log
		touched bool
		want    row
		evs     []ev
	}{
		{"first reading ever: a change from nothing", row{}, false, reading(1, t0), true,
			row{data: 1, lastSeen: t0, lastReadingTime: t0, changedAt: t0, revision: 1, lastSeq: 10},
			[]ev{{event.TypeStateChanged, 1, nil}}},
		{"repeated value: no event", online, true, reading(1, t0.Add(time.Minute)), true,
			row{data: 1, lastSeen: t0.Add(time.Minute), lastReadingTime: t0.Add(time.Minute), changedAt: t0, revision: 4, lastSeq: 10},
			nil},
		{"changed value", online, true, reading(0, t0.Add(time.Minute)), true,
			row{data: 0, lastSeen: t0.Add(time.Minute), lastReadingTime: t0.Add(time.Minute), changedAt: t0.Add(time.Minute), revision: 5, lastSeq: 10},
			[]ev{{event.TypeStateChanged, 0, &one}}},
		{"liveness timeout after a silence: lost", online, true, timeout(t0.Add(time.Hour), time.Hour), true,
			row{data: 1, lastSeen: t0, lastReadingTime: t0, changedAt: t0, revision: 5, lost: true, lastSeq: 10},
			[]ev{{event.TypeConnectionLost, 1, &one}}},
		{"liveness timeout overtaken by a reading: stale", online, true, timeout(t0.Add(time.Hour-time.Second), time.Hour), false, online, nil},
		{"liveness timeout of a lost sensor: nothing", lost, true, timeout(t0.Add(2*time.Hour), time.Hour), false, lost, nil},
		{"liveness timeout of an unknown sensor: nothing", row{}, false, timeout(t0, time.Hour), false, row{}, nil},
		{"reading of a lost sensor, same value: restored", lost, true, reading(1, t0.Add(2*time.Hour)), true,
			row{data: 1, lastSeen: t0.Add(2 * time.Hour), lastReadingTime: t0.Add(2 * time.Hour), changedAt: t0, revision: 5, lastSeq: 10},
			[]ev{{event.TypeConnectionRestored, 1, &one}}},
		{"reading of a lost sensor, other value: restored, then changed", lost, true, reading(0, t0.Add(2*time.Hour)), true,
			row{data: 0, lastSeen: t0.Add(2 * time.Hour), lastReadingTime: t0.Add(2 * time.Hour), changedAt: t0.Add(2 * time.Hour), revision: 6, lastSeq: 10},
			[]ev{{event.TypeConnectionRestored, 0, &one}, {event.TypeStateChanged, 0, &one}}},
		{"untracked reading (beyond LOCKS_UNREGISTERED_MAX): no row, no event", row{}, false, untracked(1, t0), false, row{}, nil},
		{"untracked reading of a sensor with a row: the mark decides, nothing changes", lost, true, untracked(0, t0.Add(2*time.Hour)), false, lost, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			got, touched, evs := step(c.cur, c.ok, c.l, 3, 10, nil)
			if touched != c.touched || got != c.want {
				t.Errorf("row %+v touched %v, want %+v touched %v", got, touched, c.want, c.touched)
			}
			if len(evs) != len(c.evs) {
				t.Fatalf("%d events %+v, want %d", len(evs), evs, len(c.evs))
			}
			for i, e := range evs {
				w := c.evs[i]
				// Revisions grow by exactly 1 per event, from the row's.
				rev := c.cur.revision + int64(i) + 1
				if e.Type != w.typ || e.Data != w.data || (e.PreviousData == nil) != (w.prev == nil) ||
					(w.prev != nil && *e.PreviousData != *w.prev) || e.Revision != rev || e.ID != event.ID("s1", rev) ||
					e.SensorID != "s1" || e.Partition != 3 || e.Seq != 10 {
					t.Errorf("event %d: %+v, want %s data %d previous %v revision %d", i, e, w.typ, w.data, w.prev, rev)
				}
			}
		})
	}
}
