package lease

import (
	"slices"
	"testing"
	"time"
)

// TestLapsed is the keep-or-stop decision for a held lease: stopped once its last renewal
// is TTL old, since the server may give it to another process from then on.
func TestLapsed(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 5, 1, 12, 0, 0, 0, time.UTC)
	const ttl = 9 * time.Second
	for _, tc := range []struct {
		name string
		age  time.Duration
		want bool
	}{
		{"just renewed", 0, false},
		{"one renewal period ago", ttl / RenewDivisor, false},
		{"a nanosecond short of the TTL", ttl - time.Nanosecond, false},
		{"exactly the TTL", ttl, true},
		{"paused far past the TTL", time.Hour, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := lapsed(now.Add(-tc.age), now, ttl); got != tc.want {
				t.Fatalf("lapsed(age %s) = %v, want %v", tc.age, got, tc.want)
			}
		})
	}
}

// TestPlanRound is the renew/steal decision of a round: the fair share, which held
// partitions are released, and which free ones are tried, in which order. A partition
// another process leases is never taken (a lease is taken only once it lapsed).
func TestPlanRound(t *testing.T) {
	t.Parallel()
	const owner = "host-1-abcd"
	// rotation is 0..n-1 from owner's start point, the order in which free ones are tried.
	rotation := func(n int, except ...int) []int {
		var out []int
		first := int(hash(owner) % uint32(n))
		for i := range n {
			if p := (first + i) % n; !slices.Contains(except, p) {
				out = append(out, p)
			}
		}
		return out
	}
	set := func(ps ...int) map[int]bool {
		m := map[int]bool{}
		for _, p := range ps {
			m[p] = true
		}
		return m
	}
	for _, tc := range []struct {
		name           string
		count, members int
		held           []int
		taken          map[int]bool
		want           plan
	}{
		{"alone, nothing held: claim all", 4, 1, nil, set(), plan{share: 4, claim: rotation(4)}},
		{"alone, all held: nothing to do", 4, 1, []int{0, 1, 2, 3}, set(0, 1, 2, 3), plan{share: 4}},
		{"a second process joined: release the highest two", 4, 2, []int{3, 0, 2, 1}, set(0, 1, 2, 3), plan{share: 2, release: []int{2, 3}}},
		{"share rounds up", 5, 2, []int{0, 1}, set(0, 1, 3, 4), plan{share: 3, claim: []int{2}}},
		{"others hold every other partition: nothing free", 4, 2, []int{0}, set(0, 1, 2, 3), plan{share: 2}},
		{"a peer's lease lapsed: its partitions are free", 6, 2, []int{0, 1}, set(0, 1, 5), plan{share: 3, claim: rotation(6, 0, 1, 5)}},
		{"more members than partitions: share of one", 2, 3, nil, set(), plan{share: 1, claim: rotation(2)}},
		{"over share by one with free ones left", 4, 4, []int{1, 2}, set(1, 2), plan{share: 1, release: []int{2}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := planRound(owner, tc.count, tc.members, tc.held, tc.taken)
			if got.share != tc.want.share || !slices.Equal(got.release, tc.want.release) || !slices.Equal(got.claim, tc.want.claim) {
				t.Fatalf("planRound = %+v, want %+v", got, tc.want)
			}
		})
	}
}
