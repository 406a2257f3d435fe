package watchdog

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// Issue 25, item 9: a reading the bridge marked untracked (an unregistered sensor beyond
// LOCKS_UNREGISTERED_MAX) gives its sensor no liveness key (so no expiry, no fact) and no
// entry in the watchdog's memory; a tracked sensor's reading next to it gets both as ever.
func TestUntrackedReadingsGetNoKey(t *testing.T) {
	t.Parallel()
	// Long enough for the watchdog to remember deadlines (it coalesces refreshes from 1 min).
	const lostAfter = time.Hour
	e := newEnv(t, lostAfter)
	ctx := t.Context()
	w, reg, _ := e.start(Config{LostAfter: lostAfter})
	now := time.Now().UTC()
	for i := range 50 {
		id := "stranger" + string(rune('A'+i%26)) + string(rune('a'+i/26))
		b, _ := json.Marshal(event.Log{V: event.Version, Kind: event.KindReading, SensorID: id, Data: 1, Time: now, ReceivedTime: now, Untracked: true})
		if _, err := e.nats.JS.PublishMsg(ctx, &nats.Msg{Subject: natsx.ReadingsSubject(id), Data: b}); err != nil {
			t.Fatal(err)
		}
	}
	e.reading("tracked1")
	kv, err := e.nats.JS.KeyValue(ctx, natsx.LivenessBucket)
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "the tracked sensor's key and every untracked reading seen", func() bool {
		_, err := kv.Get(ctx, keyOf("tracked1", testPartitions))
		return err == nil && counter(t, reg, "locks_watchdog_untracked_readings_total") == 50 && remembered(w) > 0
	})
	keys, err := kv.ListKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var all []string
	for k := range keys.Keys() {
		if !strings.HasPrefix(k, positionKeyPrefix) { // the partitions' positions: no sensor's
			all = append(all, k)
		}
	}
	if len(all) != 1 || all[0] != keyOf("tracked1", testPartitions) {
		t.Fatalf("liveness keys %v, want only tracked1's", all)
	}
	if n := remembered(w); n != 1 {
		t.Fatalf("the watchdog remembers %d sensors, want 1 (tracked1)", n)
	}
}

// remembered is how many sensors the watchdog keeps a refresh deadline for.
func remembered(w *Watchdog) int {
	n := 0
	w.partsMu.RLock()
	defer w.partsMu.RUnlock()
	for _, ps := range w.parts {
		ps.mu.Lock()
		n += len(ps.written)
		ps.mu.Unlock()
	}
	return n
}
