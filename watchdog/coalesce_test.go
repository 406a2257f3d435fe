package watchdog

import (
	"testing"
	"time"
)

// With a production-sized lost_after, a reporting sensor's key is written once per
// lost_after/4, not per reading; the sweep sees such keys as consistent.
func TestRefreshesCoalesce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Minute)
	ctx := t.Context()
	w, reg, _ := e.start(Config{LostAfter: time.Minute})
	const sensors, each = 10, 20
	last := map[string]time.Time{}
	for range each {
		for s := range sensors {
			id := "co" + string(rune('a'+s))
			last[id] = e.reading(id)
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	for counter(t, reg, "locks_watchdog_refreshes_total")+counter(t, reg, "locks_watchdog_refreshes_coalesced_total") < sensors*each {
		if time.Now().After(deadline) {
			t.Fatalf("readings not applied within 20 s: %v refreshed, %v coalesced",
				counter(t, reg, "locks_watchdog_refreshes_total"), counter(t, reg, "locks_watchdog_refreshes_coalesced_total"))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := counter(t, reg, "locks_watchdog_refreshes_total"); got != sensors {
		t.Fatalf("%v key writes for %d sensors reporting %d times within seconds, want one each", got, sensors, each)
	}
	for id, at := range last {
		if _, err := e.pg.Exec(ctx, `INSERT INTO sensor_state (sensor_id, partition, data, last_seen, last_reading_time, changed_at, revision, last_seq)
			VALUES ($1, 0, 1, $2, $2, $2, 1, 1)`, id, at); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := w.Sweep(ctx); err != nil || n != 0 {
		t.Fatalf("sweep over coalesced keys: %d repairs, %v; want 0", n, err)
	}
	// Short timeouts write every reading (see coalesceSlack).
	if coalesceSlack(3*time.Second) != 0 || coalesceSlack(time.Hour) != 15*time.Minute {
		t.Fatal("coalesceSlack changed")
	}
}

func TestTTLFor(t *testing.T) {
	t.Parallel()
	cases := []struct {
		left, want time.Duration
	}{
		{3 * time.Second, 3 * time.Second},
		{2900 * time.Millisecond, 3 * time.Second},
		{3001 * time.Millisecond, 4 * time.Second},
		{time.Nanosecond, time.Second},
		{time.Hour - 500*time.Millisecond, time.Hour}, // never early: rounded up
		{0, time.Second},                              // due now: expires at once, goes through the check
		{-time.Hour, time.Second},
	}
	for _, c := range cases {
		t.Run(c.left.String(), func(t *testing.T) {
			if got := ttlFor(c.left); got != c.want {
				t.Errorf("ttlFor(%s) = %s, want %s", c.left, got, c.want)
			}
		})
	}
}

// The TTL of a reading's key write is what is left of the sensor's own lost_after, counted
// from the reading's receive time, not from when the watchdog gets to it.
func TestRefreshMsgTTL(t *testing.T) {
	t.Parallel()
	w := offline(t, Config{PartitionCount: 4, LostAfter: time.Hour}, map[string]time.Duration{"slow": 5 * time.Second})
	now := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	cases := []struct {
		name     string
		sensor   string
		received time.Time
		want     time.Duration
	}{
		{"fresh reading: the whole lost_after", "door0", now, time.Hour},
		{"applied 10 min late: what is left", "door0", now.Add(-10 * time.Minute), 50 * time.Minute},
		{"part of a second left: rounded up", "door0", now.Add(-time.Hour + 1500*time.Millisecond), 2 * time.Second},
		{"already overdue: at once", "door0", now.Add(-2 * time.Hour), time.Second},
		{"override", "slow", now.Add(-time.Second), 4 * time.Second},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			msg, ttl := w.refreshMsg(c.sensor, c.received, 7, now)
			if ttl != c.want {
				t.Errorf("TTL %s, want %s", ttl, c.want)
			}
			if want := "$KV.liveness." + keyOf(c.sensor, 4); msg.Subject != want {
				t.Errorf("subject %s, want %s", msg.Subject, want)
			}
			if want := string(encodeValue(c.received, 7, false)); string(msg.Data) != want {
				t.Errorf("value %s, want %s", msg.Data, want)
			}
		})
	}
}

func TestCoalesceSlack(t *testing.T) {
	t.Parallel()
	cases := []struct {
		lostAfter, want time.Duration
	}{
		{time.Second, 0},
		{3 * time.Second, 0},
		{59 * time.Second, 0}, // short timeouts write every reading
		{time.Minute, 15 * time.Second},
		{time.Hour, 15 * time.Minute},
		{24 * time.Hour, 6 * time.Hour},
	}
	for _, c := range cases {
		t.Run(c.lostAfter.String(), func(t *testing.T) {
			if got := coalesceSlack(c.lostAfter); got != c.want {
				t.Errorf("coalesceSlack(%s) = %s, want %s", c.lostAfter, got, c.want)
			}
		})
	}
}

// refreshDue skips a write only when the key already stands for a reading at most the slack
// older than this one, whatever the rounding of the stored deadline to whole seconds.
func TestRefreshDue(t *testing.T) {
	t.Parallel()
	const slack = 15 * time.Minute
	sec := int64(time.Second)
	stored := uint32(1_795_341_600) // deadline last written, rounded up
	lo := int64(stored)*sec - sec   // the true one lies in (lo, lo+1s]
	cases := []struct {
		name     string
		stored   uint32
		known    bool
		deadline int64
		slack    time.Duration
		want     bool
	}{
		{"nothing remembered", 0, false, lo, slack, true},
		{"no coalescing (short lost_after)", stored, true, lo + sec, 0, true},
		{"same deadline", stored, true, lo + sec, slack, false},
		{"at the lower end", stored, true, lo, slack, false},
		{"just within the slack", stored, true, lo + int64(slack) - 1, slack, false},
		{"at the slack", stored, true, lo + int64(slack), slack, true},
		{"past the slack", stored, true, lo + int64(slack) + sec, slack, true},
		{"older than the key's reading", stored, true, lo - 1, slack, true},
		{"much older (reordered)", stored, true, lo - int64(time.Hour), slack, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := refreshDue(c.stored, c.known, c.deadline, c.slack); got != c.want {
				t.Errorf("refreshDue(%d, %v, %d, %s) = %v, want %v", c.stored, c.known, c.deadline, c.slack, got, c.want)
			}
		})
	}
}

// needsRefresh keeps its deadlines in whole seconds; a key must still never stand for a
// reading more than the slack (lost_after/4) older than the last one, whatever the rounding.
func TestNeedsRefreshRounding(t *testing.T) {
	t.Parallel()
	w := &Watchdog{cfg: Config{PartitionCount: 1, LostAfter: time.Hour}}
	empty := map[string]time.Duration{}
	w.overrides.Store(&empty)
	ps := &partState{}
	t0 := time.Date(2026, 11, 22, 10, 0, 0, 300_000_000, time.UTC) // not on a second
	for _, c := range []struct {
		after time.Duration // receive time after t0
		want  bool
	}{
		{0, true},
		{time.Millisecond, false},
		{15*time.Minute - 701*time.Millisecond, false}, // under the slack, even counted from the rounded-up deadline
		{15 * time.Minute, true},                       // the slack: written
		{15*time.Minute + time.Second, false},
		{15*time.Minute - 2*time.Second, true}, // older than the key's reading by more than the rounding: written
		{30*time.Minute - 3*time.Second, false},
		{30*time.Minute - 2*time.Second, true},
	} {
		if got := w.needsRefresh(ps, "s1", t0.Add(c.after)); got != c.want {
			t.Errorf("reading at t0+%s: needsRefresh %v, want %v", c.after, got, c.want)
		}
	}
	if got := w.needsRefresh(ps, "a-name-longer-than-16", t0); !got || len(ps.written) != 1 {
		t.Errorf("an id that is no sensor key: needsRefresh %v and %d entries, want written and not remembered", got, len(ps.written))
	}
}
