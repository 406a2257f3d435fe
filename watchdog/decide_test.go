package watchdog

import (
	"testing"
	"time"

	"github.com/lock-sensors/lock-sensors/internal/event"
)

// TestJudge is the settle decision: lost, still alive (refresh for the time left), or
// already declared, from the sensor's last message and the time now.
func TestJudge(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 5, 1, 12, 0, 0, 0, time.UTC)
	reading := func(age time.Duration) event.Log {
		return event.Log{Kind: event.KindReading, ReceivedTime: now.Add(-age)}
	}
	for _, tc := range []struct {
		name      string
		last      event.Log
		lostAfter time.Duration
		want      verdict
		left      time.Duration
	}{
		{"silent for exactly lost_after", reading(time.Hour), time.Hour, silent, 0},
		{"silent for longer", reading(3 * time.Hour), time.Hour, silent, 0},
		{"reading younger than lost_after", reading(40 * time.Minute), time.Hour, stillAlive, 20 * time.Minute},
		{"reading a nanosecond short", reading(time.Hour - time.Nanosecond), time.Hour, stillAlive, time.Nanosecond},
		{"reading from the future (skewed clock)", reading(-time.Minute), time.Hour, stillAlive, time.Hour + time.Minute},
		{"per-sensor lost_after shorter", reading(10 * time.Minute), 5 * time.Minute, silent, 0},
		{"already declared", event.Log{Kind: event.KindLivenessTimeout, ReceivedTime: now.Add(-time.Minute)}, time.Hour, alreadyDeclared, 0},
		{"declared long ago", event.Log{Kind: event.KindLivenessTimeout, ReceivedTime: now.Add(-48 * time.Hour)}, time.Hour, alreadyDeclared, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			v, left := judge(tc.last, tc.lostAfter, now)
			if v != tc.want || left != tc.left {
				t.Fatalf("judge = (%v, %v), want (%v, %v)", v, left, tc.want, tc.left)
			}
		})
	}
}

// TestHeldDue is the hold decision: an expiry is settled once its partition has applied
// every reading stored before it, or after MaxHold whatever the lag; otherwise it stays held.
func TestHeldDue(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 5, 1, 12, 0, 0, 0, time.UTC)
	const maxHold = 10 * time.Minute
	at := now.Add(-time.Minute)
	held := func(since time.Duration) candidate { return candidate{at: at, heldSince: now.Add(-since)} }
	for _, tc := range []struct {
		name          string
		c             candidate
		upTo          int64
		known         bool
		caught, overd bool
	}{
		{"caught up past the expiry", held(time.Minute), at.UnixNano() + 1, true, true, false},
		{"caught up to the expiry exactly", held(time.Minute), at.UnixNano(), true, true, false},
		{"partition behind the expiry", held(time.Minute), at.UnixNano() - 1, true, false, false},
		{"progress unknown (upstream behind)", held(time.Minute), 0, false, false, false},
		{"behind, held for max_hold", held(maxHold), at.UnixNano() - 1, true, false, true},
		{"unknown, held past max_hold", held(2 * maxHold), 0, false, false, true},
		{"caught up and past max_hold: caught, not overdue", held(2 * maxHold), at.UnixNano(), true, true, false},
		{"nothing left undelivered", held(time.Minute), int64(^uint64(0) >> 1), true, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			caught, overdue := heldDue(tc.c, tc.upTo, tc.known, now, maxHold)
			if caught != tc.caught || overdue != tc.overd {
				t.Fatalf("heldDue = (%v, %v), want (%v, %v)", caught, overdue, tc.caught, tc.overd)
			}
		})
	}
}
