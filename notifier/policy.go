package notifier

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Stop is what Policy.Next returns when no further attempt is due.
const Stop time.Duration = -1

// Policy is the retry schedule: Schedule[i] is the delay before attempt i+2, so a schedule
// of n delays allows n+1 attempts.
type Policy struct {
	Schedule []time.Duration
	// MaxRetryAfter bounds how long a Retry-After header may push an attempt back
	// (default: the longest delay of the schedule).
	MaxRetryAfter time.Duration
}

// Attempts is the number of attempts the policy allows.
func (p Policy) Attempts() int { return len(p.Schedule) + 1 }

// Next is the delay after the failed attempt number attempt (1-based) before the next one,
// or Stop when that was the last. It is pure: jitter and Retry-After are applied by Delay.
func (p Policy) Next(attempt int) time.Duration {
	if attempt < 1 || attempt > len(p.Schedule) {
		return Stop
	}
	return p.Schedule[attempt-1]
}

// Delay is the wait before the attempt after attempt: Next(attempt) stretched by jitter u in
// [0,1) by up to a fifth (never shorter than the schedule, so receivers see the documented
// minimum gaps while a burst of failures spreads out), and lengthened to a Retry-After the
// receiver asked for, within MaxRetryAfter. Retry-After never shortens the schedule: a
// receiver cannot make us use up the attempts faster than planned.
func (p Policy) Delay(attempt int, u float64, retryAfter time.Duration) time.Duration {
	d := p.Next(attempt)
	if d == Stop {
		return Stop
	}
	if u < 0 {
		u = 0
	}
	if u >= 1 {
		u = 0.999
	}
	d += time.Duration(float64(d) * 0.2 * u)
	if retryAfter > 0 {
		limit := p.MaxRetryAfter
		if limit <= 0 {
			for _, s := range p.Schedule {
				limit = max(limit, s)
			}
		}
		d = max(d, min(retryAfter, limit))
	}
	return d
}

// afterFailure decides what follows the failed attempt number attempt of a schedule, given
// jitter u in [0,1) and the response's status and Retry-After header as read at now: pending
// again after delay, or dead when the schedule is used up.
func (p Policy) afterFailure(attempt int, u float64, status int, retryAfter string, now time.Time) (state string, delay time.Duration) {
	d := p.Delay(attempt, u, RetryAfter(status, retryAfter, now))
	if d == Stop {
		return StateDead, 0
	}
	return StatePending, d
}

// RetryAfter parses a Retry-After header (delta seconds or an HTTP date) of a 429 or 503
// response; 0 means none or unusable.
func RetryAfter(status int, h string, now time.Time) time.Duration {
	if status != http.StatusTooManyRequests && status != http.StatusServiceUnavailable {
		return 0
	}
	h = strings.TrimSpace(h)
	if h == "" {
		return 0
	}
	if s, err := strconv.ParseInt(h, 10, 64); err == nil {
		if s <= 0 || s > 1<<31 {
			return 0
		}
		return time.Duration(s) * time.Second
	}
	if t, err := http.ParseTime(h); err == nil {
		if d := t.Sub(now); d > 0 {
			return d
		}
	}
	return 0
}
