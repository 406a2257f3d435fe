package natsx

import (
	"context"
	"fmt"
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

// applyMaxAges gives the existing READINGS, EVENTS and DELIVERIES the age limits the operator
// configured explicitly (Set), lowering or raising theirs; Declare leaves every other limit of
// an existing stream as it is. The duplicate window stays within the age, as the server requires.
func applyMaxAges(ctx context.Context, js jetstream.JetStream, c StreamsConfig) error {
	for _, w := range []struct {
		stream string
		age    MaxAge
	}{{ReadingsStream, c.ReadingsMaxAge}, {EventsStream, c.EventsMaxAge}, {DeliveriesStream, c.DeliveriesMaxAge}} {
		if !w.age.Set {
			continue
		}
		s, err := js.Stream(ctx, w.stream)
		if err != nil {
			return fmt.Errorf("look up stream %s: %w", w.stream, err)
		}
		cfg := s.CachedInfo().Config
		if cfg.MaxAge == w.age.Age {
			continue
		}
		cfg.MaxAge = w.age.Age
		if cfg.MaxAge > 0 {
			cfg.Duplicates = min(cfg.Duplicates, cfg.MaxAge)
		}
		if _, err := js.UpdateStream(ctx, cfg); err != nil {
			return fmt.Errorf("set the max age of stream %s to %s: %w", w.stream, w.age.Age, err)
		}
	}
	return nil
}
