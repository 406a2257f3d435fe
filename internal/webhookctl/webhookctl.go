// Package webhookctl holds what the admin API and the notifier share about the webhook
// controls: the event types a client or subscription may choose, the per-client statistics,
// and the errors of a resend, so that neither part imports the other.
package webhookctl

import (
	"errors"
	"fmt"
	"slices"
	"time"
)

// The webhook types (the body's "type"); a filter names some of them, or none for all.
const (
	TypeStateChanged       = "sensor.state_changed"
	TypeConnectionLost     = "sensor.connection_lost"
	TypeConnectionRestored = "sensor.connection_restored"
	TypeTest               = "sensor.test"
)

// Types are the webhook types a filter may name.
var Types = []string{TypeStateChanged, TypeConnectionLost, TypeConnectionRestored, TypeTest}

// CheckTypes reports the first type of a filter that is not one of Types, or a duplicate.
func CheckTypes(types []string) error {
	for i, t := range types {
		if !slices.Contains(Types, t) {
			return fmt.Errorf("%q is not an event type (one of %v)", t, Types)
		}
		if slices.Contains(types[:i], t) {
			return fmt.Errorf("%q is named twice", t)
		}
	}
	return nil
}

// Errors of a resend.
var (
	// ErrNoDelivery: the client has no delivery of that event.
	ErrNoDelivery = errors.New("no such delivery")
	// ErrNotFinished: the delivery is still pending (it will be attempted anyway), or was
	// cancelled because the client unsubscribed.
	ErrNotFinished = errors.New("delivery is not dead or delivered")
	// ErrSuperseded: the client has a newer event of the same sensor; sending the older one
	// again would put an older revision after a newer one.
	ErrSuperseded = errors.New("delivery superseded by a newer event of its sensor")
)

// Stats are one client's delivery figures over the rows the notifier's delivery table holds:
// every pending and dead delivery, and the finished ones of the retention (7 days by default).
type Stats struct {
	Delivered      int64 // deliveries a 2xx answered
	FailedAttempts int64 // attempts that got no 2xx (an error, a timeout, another status)
	Retried        int64 // deliveries that took more than one attempt
	Dead           int64 // deliveries whose every attempt failed
	Pending        int64 // deliveries waiting for an attempt (or for the endpoint's re-enable)
	// Latency of the successful attempt of delivered deliveries; zero when none.
	LatencyP50, LatencyP90, LatencyP99 time.Duration
	LastSuccess                        time.Time // zero: none in the window
	DisabledAt                         time.Time // zero: enabled
	DisabledReason                     string
}
