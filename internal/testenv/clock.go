package testenv

import (
	"sync"
	"time"
)

// AheadClock is the system clock moved ahead by what the test adds: a part that takes its
// clock from its Deps sees a deadline pass without the test waiting for it. Safe for
// concurrent use.
type AheadClock struct {
	mu  sync.Mutex
	off time.Duration
}

// ClockAhead is an AheadClock d ahead of the system clock.
func ClockAhead(d time.Duration) *AheadClock { return &AheadClock{off: d} }

// Now is the system time plus the offset.
func (c *AheadClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.off)
}

// Add moves the clock d further ahead.
func (c *AheadClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.off += d
}
