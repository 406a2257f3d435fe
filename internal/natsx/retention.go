package natsx

import (
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// MaxAge is a stream's age limit as configured (LOCKS_READINGS_MAX_AGE, LOCKS_EVENTS_MAX_AGE,
// LOCKS_DELIVERIES_MAX_AGE). Age 0 keeps messages for ever. Set says the operator gave the
// value: only then does a start apply it to an existing stream, lowering or raising its limit;
// otherwise an existing stream keeps the limit it has (an operator may have set it by hand).
type MaxAge struct {
	Age time.Duration
	Set bool
}

// DeliveriesMaxAgeDefault is the default age limit of DELIVERIES, the attempt records the
// history projector copies to ClickHouse within seconds. READINGS, the truth, and EVENTS, which
// a history rebuild refills ClickHouse's events from and a state rebuild checks against, are
// kept for ever unless configured.
const DeliveriesMaxAgeDefault = 7 * 24 * time.Hour

// orDefault is a's age, or def when nothing was configured.
func (a MaxAge) orDefault(def time.Duration) time.Duration {
	if a.Set || a.Age > 0 {
		return a.Age
	}
	return def
}

// applyMaxAge sets next's age limit to want's when the operator configured it explicitly. The
// duplicate window stays within the age, which the server requires.
func applyMaxAge(next *jetstream.StreamConfig, want jetstream.StreamConfig, set bool) {
	if set {
		next.MaxAge = want.MaxAge
	}
	if next.MaxAge > 0 {
		next.Duplicates = min(next.Duplicates, next.MaxAge)
	}
}
