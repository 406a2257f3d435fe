// Package backoff is the one growing delay and the one cancellable sleep that every part
// uses between retries of something that failed for a transient reason (a server away).
package backoff

import (
	"context"
	"time"
)

// Sleep waits d, or less when ctx ends first; it reports whether the whole d passed.
func Sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// Policy is a doubling delay from Min to Max. The zero Policy is 100ms to 5s.
type Policy struct {
	Min, Max time.Duration
}

// Defaults of the zero Policy.
const (
	MinDefault = 100 * time.Millisecond
	MaxDefault = 5 * time.Second
)

func (p Policy) bounds() (time.Duration, time.Duration) {
	lo, hi := p.Min, p.Max
	if lo <= 0 {
		lo = MinDefault
	}
	if hi <= 0 {
		hi = MaxDefault
	}
	return lo, max(lo, hi)
}

// Next is the delay after the attempt-th consecutive failure (1 is the first): Min, then
// doubling, never above Max.
func (p Policy) Next(attempt int) time.Duration {
	lo, hi := p.bounds()
	d := lo
	for i := 1; i < attempt && d < hi; i++ {
		d *= 2
	}
	return min(d, hi)
}

// Backoff counts consecutive failures under a Policy. It is not safe for concurrent use:
// each retry loop has its own.
type Backoff struct {
	Policy
	fails int
}

// New is a Backoff from min to max.
func New(min, max time.Duration) *Backoff { return &Backoff{Policy: Policy{Min: min, Max: max}} }

// Wait counts a failure and sleeps the delay it earns; false means ctx ended first.
func (b *Backoff) Wait(ctx context.Context) bool {
	b.fails++
	return Sleep(ctx, b.Next(b.fails))
}

// Delay is what the next Wait would sleep.
func (b *Backoff) Delay() time.Duration { return b.Next(b.fails + 1) }

// Fails is the number of consecutive failures counted since the last Reset.
func (b *Backoff) Fails() int { return b.fails }

// Reset forgets the failures after a success.
func (b *Backoff) Reset() { b.fails = 0 }
