package watchdog

import (
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// TestBurstThroughQueue lets many sensors go silent at once through a watchdog with only two
// settle workers, so that the due expiries wait in the settle queue and the declared marks
// wait until it is empty: each silent sensor gets exactly one fact, the one that kept
// reporting none, and every silent sensor's key ends marked declared (no mark is left
// behind when the workers stop).
func TestBurstThroughQueue(t *testing.T) {
	t.Parallel()
	const silent = 300
	e := newEnv(t, lostAfter)
	f := e.collectFacts()
	_, reg, _ := e.start(Config{LostAfter: lostAfter, Concurrency: 2})
	for i := range silent {
		e.reading("burst" + strconv.Itoa(i))
	}
	// A sensor that keeps reporting through the burst is never declared.
	stopChatty := make(chan struct{})
	chattyDone := make(chan struct{})
	go func() {
		defer close(chattyDone)
		tick := time.NewTicker(lostAfter / 6)
		defer tick.Stop()
		for {
			e.reading("chatty")
			select {
			case <-stopChatty:
				return
			case <-tick.C:
			}
		}
	}()
	testenv.Eventually(t, lostAfter+30*time.Second, "a fact for every silent sensor", func() bool {
		return counter(t, reg, "locks_watchdog_facts_total") >= silent
	})
	close(stopChatty)
	<-chattyDone
	kv, err := e.nats.JS.KeyValue(t.Context(), natsx.LivenessBucket)
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "every silent sensor's key marked declared", func() bool {
		for i := range silent {
			entry, err := kv.Get(t.Context(), keyOf("burst"+strconv.Itoa(i), testPartitions))
			if err != nil {
				return false
			}
			var v keyValue
			if json.Unmarshal(entry.Value(), &v) != nil || !v.Lost {
				return false
			}
		}
		return true
	})
	if n := counter(t, reg, "locks_watchdog_settle_queue"); n != 0 {
		t.Errorf("locks_watchdog_settle_queue = %v once every expiry is settled, want 0", n)
	}
	time.Sleep(500 * time.Millisecond) // a second fact would have landed by now
	for i := range silent {
		if n := len(f.of("burst" + strconv.Itoa(i))); n != 1 {
			t.Errorf("burst%d: %d facts, want 1", i, n)
		}
	}
	if n := len(f.of("chatty")); n != 0 {
		t.Errorf("chatty: %d facts, want 0: it kept reporting", n)
	}
}
