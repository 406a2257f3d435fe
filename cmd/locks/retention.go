package main

import (
	"time"

	"github.com/lock-sensors/lock-sensors/notifier"
)

// deadRetention is LOCKS_NOTIFIER_DEAD_RETENTION for the notifier, where 0 means its default
// and "until redriven" has a name of its own.
func deadRetention(d time.Duration) time.Duration {
	if d == 0 {
		return notifier.KeepUntilRedriven
	}
	return d
}
