package watchdog

import (
	"testing"
	"time"

	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// TestHeldExpiryDeclaredAtMaxHold stops the bridge (RabbitMQ's queue has no consumer: the
// pipeline is behind) and lets a sensor go silent: its expiry is held, the held gauges show
// it, and once it has been held for MaxHold it is declared although the bridge is still
// down, and counted as declared at the bound.
func TestHeldExpiryDeclaredAtMaxHold(t *testing.T) {
	t.Parallel()
	// The test waits lost_after, MaxHold and lost_after again: the shortest that are still
	// clearly apart.
	const lostAfter, maxHold = 2 * time.Second, 4 * time.Second
	e := newEnv(t, lostAfter)
	f := e.collectFacts()
	_, reg, _ := e.start(Config{LostAfter: lostAfter, MaxHold: maxHold})
	before := time.Now() // no later than the reading's receive time
	e.publishRabbit("gone", 0)
	testenv.Eventually(t, 10*time.Second, "the reading to reach the watchdog", func() bool {
		return counter(t, reg, "locks_watchdog_refreshes_total") >= 1
	})
	e.stopBridge()

	// The key expires after lost_after; the expiry is held, and the gauges say so.
	testenv.Eventually(t, lostAfter+5*time.Second+time.Since(before), "the gauges to show one expiry held", func() bool {
		return counter(t, reg, "locks_watchdog_held_expiries") == 1 && counter(t, reg, "locks_watchdog_held_expiry_oldest_seconds") > 0
	})
	heldSeen := time.Now()
	if n := len(f.of("gone")); n != 0 {
		t.Fatalf("%d facts while the expiry was held", n)
	}

	// Still behind (the bridge stays down), yet declared once held for MaxHold.
	got, ok := f.waitFact("gone", heldSeen.Add(maxHold+10*time.Second))
	if !ok {
		t.Fatalf("not declared within MaxHold (%s) + 10 s of being held, with the bridge down", maxHold)
	}
	if held := got.fact.ReceivedTime.Sub(before); held < lostAfter+maxHold {
		t.Errorf("declared %s after the last reading was sent, want at least lost_after + MaxHold = %s", held, lostAfter+maxHold)
	}
	if got.fact.LostAfter != lostAfter {
		t.Errorf("fact lost_after %s, want %s", got.fact.LostAfter, lostAfter)
	}
	testenv.Eventually(t, 5*time.Second, "the held gauges to return to 0", func() bool {
		return counter(t, reg, "locks_watchdog_held_expiries") == 0 && counter(t, reg, "locks_watchdog_held_expiry_oldest_seconds") == 0
	})
	// Counted once the fact's append is acknowledged, which may come after a reader sees it.
	testenv.Eventually(t, 5*time.Second, "locks_watchdog_expiries_declared_at_max_hold_total to be 1", func() bool {
		return counter(t, reg, "locks_watchdog_expiries_declared_at_max_hold_total") == 1
	})
	time.Sleep(lostAfter)
	if n := counter(t, reg, "locks_watchdog_expiries_declared_at_max_hold_total"); n != 1 {
		t.Errorf("locks_watchdog_expiries_declared_at_max_hold_total = %v, want 1", n)
	}
	if n := len(f.of("gone")); n != 1 {
		t.Errorf("%d facts, want 1", n)
	}
}
