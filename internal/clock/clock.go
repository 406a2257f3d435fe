// Package clock is the time a part reads. Parts take a Clock in their Deps and pass its Now
// to their decisions, which are pure functions of (state, facts, now): a test sets the time
// instead of waiting for it.
package clock

import "time"

// Clock tells the time.
type Clock interface {
	Now() time.Time
}

// System is the machine's clock.
type System struct{}

// Now is time.Now.
func (System) Now() time.Time { return time.Now() }

// Or is c, or the System clock when c is nil: a Deps without a Clock runs on real time.
func Or(c Clock) Clock {
	if c == nil {
		return System{}
	}
	return c
}
