package lease

import (
	"slices"
	"time"
)

// lapsed reports whether a lease last renewed at renewed is past its TTL at now: paused or
// cut off that long, this process may have lost it to another and stops its worker.
func lapsed(renewed, now time.Time, ttl time.Duration) bool {
	return now.Sub(renewed) >= ttl
}

// plan is what a round does once its leases are renewed: release the extra partitions
// above the fair share, then try to claim the free ones, in order, until the share is held.
type plan struct {
	share   int
	release []int
	claim   []int
}

// planRound decides the round of owner, which holds the partitions held, out of count,
// shared among members live processes (itself included), given the partitions taken
// (leased by anyone). The share is ceil(count/members); the highest held partitions go
// first; the free ones are tried from a start point hashed from the owner, so processes
// starting together try different partitions first.
func planRound(owner string, count, members int, held []int, taken map[int]bool) plan {
	pl := plan{share: (count + members - 1) / members}
	kept := slices.Sorted(slices.Values(held))
	if extra := len(kept) - pl.share; extra > 0 {
		pl.release = kept[len(kept)-extra:]
		kept = kept[:len(kept)-extra]
	}
	if len(kept) >= pl.share {
		return pl
	}
	first := int(hash(owner) % uint32(count))
	for i := range count {
		p := (first + i) % count
		if !taken[p] && !slices.Contains(kept, p) {
			pl.claim = append(pl.claim, p)
		}
	}
	return pl
}
