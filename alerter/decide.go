package alerter

import (
	"maps"
	"slices"
	"time"

	"github.com/lock-sensors/lock-sensors/internal/procs"
)

// transitions is what one evaluation of a kind does to its alerts (transitionsOf).
type transitions struct {
	still   map[string]int64 // firing and still holding: details updated, no notice
	resolve []int64          // firing ids whose condition no longer holds
	fire    []string         // subjects whose condition holds and that are not firing
}

// transitionsOf decides the fire/resolve transitions from the firing alerts of a kind
// (subject → alert id) and the subjects whose condition holds now. Both lists are sorted,
// so notices are queued in a stable order.
func transitionsOf(firing map[string]int64, conds map[string]condition) transitions {
	tr := transitions{still: map[string]int64{}}
	for _, subject := range slices.Sorted(maps.Keys(firing)) {
		if _, holds := conds[subject]; holds {
			tr.still[subject] = firing[subject]
		} else {
			tr.resolve = append(tr.resolve, firing[subject])
		}
	}
	for _, subject := range slices.Sorted(maps.Keys(conds)) {
		if _, ok := firing[subject]; !ok {
			tr.fire = append(tr.fire, subject)
		}
	}
	return tr
}

// setAsideFiring says whether a consumer's set-aside records hold an alert: its last record
// (sequence seq, stored at) is newer than any alert raised for it (mark), or younger than
// quiet at now.
func setAsideFiring(seq, mark int64, at, now time.Time, quiet time.Duration) bool {
	return seq > mark || now.Sub(at) < quiet
}

// massLost says whether group sensors lost together out of total are a mass loss: at least
// min of them, and more than share of all.
func massLost(total, group int64, min int, share float64) bool {
	return total > 0 && group >= int64(min) && float64(group) > share*float64(total)
}

// stoppedProcesses are the processes of ps that stopped reporting: not updated for stale at
// now, and not replaced by a fresh process on the same host started after their last
// report that runs every part they ran (a restart).
func stoppedProcesses(ps []procs.Info, now time.Time, stale time.Duration) []procs.Info {
	fresh := func(p procs.Info) bool { return now.Sub(p.UpdatedAt) < stale }
	var out []procs.Info
	for _, p := range ps {
		if fresh(p) {
			continue
		}
		replaced := slices.ContainsFunc(ps, func(q procs.Info) bool {
			return q.ID != p.ID && q.Host == p.Host && fresh(q) && q.StartedAt.After(p.UpdatedAt) &&
				!slices.ContainsFunc(p.Parts, func(part string) bool { return !slices.Contains(q.Parts, part) })
		})
		if !replaced {
			out = append(out, p)
		}
	}
	return out
}
