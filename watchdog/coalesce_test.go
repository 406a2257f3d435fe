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
