package faults_test

import (
	"slices"
	"testing"
	"time"

	"github.com/lock-sensors/lock-sensors/internal/partition"
)

// SIGKILL one of the two notifier processes: the other takes its EVENTS partitions within
// 10 s and every state change still reaches the receiver, in revision order per sensor. A
// webhook in flight at the kill (sent, its outcome not yet committed) is sent again by the
// new owner with the same webhook-id, which receivers de-duplicate (invariant 2): this
// scenario alone counts such duplicates instead of failing on them.
func TestFaultNotifierProcessKilled(t *testing.T) {
	requireFaults(t)
	r := startRun(t, localServers(t), 60*time.Second)
	r.duplicatesOK = true
	had, _ := r.killTakenOver("notifier")
	res := r.finish()
	t.Logf("notifier killed with partitions %v: %d webhooks received twice with one webhook-id", had, res.duplicates)
}

// SIGKILL one of the two watchdog processes: the other takes its partitions within 10 s, no
// sensor that kept reporting is declared lost, and each sensor that fell silent, those of
// the killed process's partitions included, is declared lost exactly once. LOCKS_LOST_AFTER
// is 45 s: past the kill and the takeover, so the survivor declares the killed process's
// silent sensors, and past the end of the checks, so the fleet stopping declares nothing then.
func TestFaultWatchdogProcessKilled(t *testing.T) {
	requireFaults(t)
	r := startLoad(t, localServers(t), load{dur: 60 * time.Second, silentRatio: 0.1, lostAfter: 45 * time.Second})
	had, takenOver := r.killTakenOver("watchdog")
	res := r.finish()
	lostAt := r.rcv.Tally().LostAt
	theirs := 0
	for _, id := range res.books.Silent {
		if !slices.Contains(had, partition.Of(id, partitions)) {
			continue
		}
		theirs++
		if lostAt[id].Before(takenOver) {
			t.Errorf("silent sensor %s was declared lost at %v, before the takeover (%v): the scenario shows nothing of it", id, lostAt[id], takenOver)
		}
	}
	t.Logf("watchdog killed with partitions %v: %d of the %d silent sensors were theirs, each declared lost once, after the takeover", had, theirs, len(res.books.Silent))
	if theirs == 0 {
		t.Error("no silent sensor in the killed watchdog's partitions: the scenario shows nothing of the takeover")
	}
}
