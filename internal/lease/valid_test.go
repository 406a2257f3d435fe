package lease

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

// Valid: a fixed partition's Work (no lease) while its ctx lives; a leased one only until
// its last renewal plus the TTL, the earliest the server can give the lease to another.
func TestValid(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	leased := func(until time.Time) context.Context {
		var u atomic.Pointer[time.Time]
		u.Store(&until)
		return context.WithValue(t.Context(), untilKey{}, validity{until: &u, clock: fixedClock(now)})
	}
	ended, cancel := context.WithCancel(t.Context())
	cancel()
	for name, c := range map[string]struct {
		ctx  context.Context
		want bool
	}{
		"fixed partition":        {t.Context(), true},
		"ended":                  {ended, false},
		"lease renewed in time":  {leased(now.Add(time.Millisecond)), true},
		"lease past renewal+TTL": {leased(now), false},
	} {
		if got := Valid(c.ctx); got != c.want {
			t.Errorf("%s: Valid = %v, want %v", name, got, c.want)
		}
	}
}

// fixedClock is a clock that stands still.
type fixedClock time.Time

func (f fixedClock) Now() time.Time { return time.Time(f) }
