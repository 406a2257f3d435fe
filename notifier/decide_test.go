package notifier

import (
	"net/http"
	"testing"
	"time"
)

// TestAfterFailure is the retry-or-give-up decision of a failed attempt: the next delay of
// the schedule (stretched by jitter, lengthened by Retry-After within the bound), or dead.
func TestAfterFailure(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 5, 1, 12, 0, 0, 0, time.UTC)
	p := Policy{Schedule: []time.Duration{time.Second, time.Minute, time.Hour}}
	for _, tc := range []struct {
		name       string
		attempt    int
		u          float64
		status     int
		retryAfter string
		state      string
		delay      time.Duration
	}{
		{"first failure", 1, 0, 500, "", StatePending, time.Second},
		{"second failure, full jitter", 2, 0.5, 500, "", StatePending, time.Minute + 6*time.Second},
		{"last delay of the schedule", 3, 0, 0, "", StatePending, time.Hour},
		{"schedule used up", 4, 0, 500, "", StateDead, 0},
		{"429 asks for longer", 1, 0, http.StatusTooManyRequests, "30", StatePending, 30 * time.Second},
		{"503 with an HTTP date", 1, 0, http.StatusServiceUnavailable, now.Add(2 * time.Minute).Format(http.TimeFormat), StatePending, 2 * time.Minute},
		{"Retry-After bounded by the longest delay", 1, 0, http.StatusTooManyRequests, "86400", StatePending, time.Hour},
		{"Retry-After never shortens", 2, 0, http.StatusTooManyRequests, "1", StatePending, time.Minute},
		{"Retry-After ignored on a 500", 1, 0, 500, "30", StatePending, time.Second},
		{"Retry-After cannot revive a used-up schedule", 4, 0, http.StatusTooManyRequests, "5", StateDead, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			state, delay := p.afterFailure(tc.attempt, tc.u, tc.status, tc.retryAfter, now)
			if state != tc.state || delay != tc.delay {
				t.Fatalf("afterFailure = (%s, %s), want (%s, %s)", state, delay, tc.state, tc.delay)
			}
		})
	}
}

// TestBreakerLets is the breaker's admission decision: a closed breaker while a slot is
// free, an open one never before its cooldown ends, a half-open one a single probe.
func TestBreakerLets(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 5, 1, 12, 0, 0, 0, time.UTC)
	p := breakerPolicy{threshold: 3, cooldown: time.Second, maxCooldown: 4 * time.Second}
	open := breaker{fails: 3, openUntil: now.Add(time.Second), cooldown: time.Second}
	halfOpen := breaker{fails: 3, openUntil: now, cooldown: time.Second}
	probing := halfOpen
	probing.probing = true
	for _, tc := range []struct {
		name            string
		b               breaker
		inflight, limit int
		want            bool
	}{
		{"closed, a slot free", breaker{}, 1, 2, true},
		{"closed, slots full", breaker{}, 2, 2, false},
		{"closed with failures below the threshold", breaker{fails: 2}, 0, 2, true},
		{"open", open, 0, 2, false},
		{"open, a nanosecond before its end", breaker{fails: 3, openUntil: now.Add(time.Nanosecond), cooldown: time.Second}, 0, 2, false},
		{"half-open: one probe", halfOpen, 0, 2, true},
		{"half-open, probe under way", probing, 1, 2, false},
		{"half-open, an attempt from before still running", halfOpen, 1, 2, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := p.lets(tc.b, tc.inflight, tc.limit, now); got != tc.want {
				t.Fatalf("lets = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestBreakerAfter is the breaker's transition on an attempt's outcome.
func TestBreakerAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 5, 1, 12, 0, 0, 0, time.UTC)
	p := breakerPolicy{threshold: 3, cooldown: time.Second, maxCooldown: 4 * time.Second}
	probe := func(cooldown time.Duration) breaker {
		return breaker{fails: 3, cooldown: cooldown, openUntil: now.Add(-time.Millisecond), probing: true}
	}
	for _, tc := range []struct {
		name   string
		b      breaker
		ok     bool
		want   breaker
		opened bool
	}{
		{"success keeps it closed", breaker{fails: 2}, true, breaker{}, false},
		{"failure below the threshold counts", breaker{fails: 1}, false, breaker{fails: 2}, false},
		{"failure reaching the threshold opens", breaker{fails: 2}, false, breaker{fails: 3, cooldown: time.Second, openUntil: now.Add(time.Second)}, true},
		{"failure past the threshold, not a probe (in flight before it opened)", breaker{fails: 3, cooldown: time.Second, openUntil: now.Add(time.Second)}, false,
			breaker{fails: 4, cooldown: time.Second, openUntil: now.Add(time.Second)}, false},
		{"failed probe doubles the cooldown", probe(time.Second), false, breaker{fails: 4, cooldown: 2 * time.Second, openUntil: now.Add(2 * time.Second)}, true},
		{"cooldown capped at the maximum", probe(3 * time.Second), false, breaker{fails: 4, cooldown: 4 * time.Second, openUntil: now.Add(4 * time.Second)}, true},
		{"successful probe closes it", probe(4 * time.Second), true, breaker{openUntil: now.Add(-time.Millisecond)}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, opened := p.after(tc.b, tc.ok, now)
			if got != tc.want || opened != tc.opened {
				t.Fatalf("after = (%+v, %v), want (%+v, %v)", got, opened, tc.want, tc.opened)
			}
		})
	}
}
