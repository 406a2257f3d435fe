package watchdog

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// TestWrittenPruned churns a fleet: thousands of sensors report once (received 50 s before
// now, so with lost_after 1m their deadlines pass within seconds) and go silent, one keeps
// a fresh deadline. The per-sensor map of written deadlines holds them all at first, then
// only the fresh one, and is remade smaller rather than keeping the fleet's size.
func TestWrittenPruned(t *testing.T) {
	t.Parallel()
	const lost = time.Minute // coalescing, hence the map, needs lost_after >= 1m
	const churned = shrinkMin*testPartitions + 1000
	e := newEnv(t, lost)
	w, reg, _ := e.start(Config{LostAfter: lost, PruneEvery: 200 * time.Millisecond})
	received := time.Now().Add(-50 * time.Second).UTC()
	for i := range churned {
		s := fmt.Sprintf("churn%d", i)
		b, _ := json.Marshal(event.Log{V: event.Version, Kind: event.KindReading, SensorID: s, Data: 1, Time: received, ReceivedTime: received, MessageID: s})
		for {
			_, err := e.nats.JS.PublishMsgAsync(&nats.Msg{Subject: natsx.ReadingsSubject(s), Data: b})
			if err == nil {
				break
			}
			// On a loaded machine the window of unacknowledged appends fills: wait for it.
			if !errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
				t.Fatal(err)
			}
			<-e.nats.JS.PublishAsyncComplete()
		}
	}
	select {
	case <-e.nats.JS.PublishAsyncComplete():
	case <-time.After(30 * time.Second):
		t.Fatal("appends not acknowledged within 30 s")
	}
	e.reading("fresh")
	testenv.Eventually(t, 30*time.Second, "every reading to refresh its key", func() bool {
		return counter(t, reg, "locks_watchdog_refreshes_total") >= churned+1
	})
	if n := w.writtenLen(); n < churned/2 {
		// Most deadlines are still ahead here (10 s after the appends began).
		t.Fatalf("%d deadlines remembered after %d sensors reported, want most of them", n, churned+1)
	}
	testenv.Eventually(t, 40*time.Second, "the churned sensors' deadlines to be forgotten", func() bool {
		return w.writtenLen() == 1
	})
	// Each partition's map held over shrinkMin entries; once remade it is sized for what
	// it held then, under shrinkMin (smaller maps are not worth remaking).
	for p, ps := range w.ownedParts() {
		ps.mu.Lock()
		peak := ps.writtenPeak
		ps.mu.Unlock()
		if peak >= shrinkMin {
			t.Errorf("partition %d: map not remade after the churn (sized for %d entries, holds %d)", p, peak, w.writtenLen())
		}
	}
	// The fresh sensor's entry still coalesces its next reading.
	before := counter(t, reg, "locks_watchdog_refreshes_coalesced_total")
	e.reading("fresh")
	testenv.Eventually(t, 10*time.Second, "the fresh sensor's next reading to be coalesced", func() bool {
		return counter(t, reg, "locks_watchdog_refreshes_coalesced_total") > before
	})
}
