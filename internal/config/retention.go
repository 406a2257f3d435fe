package config

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/lock-sensors/lock-sensors/internal/natsx"
)

// Retention is how long what the system stores is kept (docs/operations.md, "Retention").
type Retention struct {
	// ReadingsMaxAge, EventsMaxAge and DeliveriesMaxAge limit the streams' ages; Set when the
	// variable was given, so that only then a start changes an existing stream's limit.
	ReadingsMaxAge, EventsMaxAge, DeliveriesMaxAge natsx.MaxAge
	// NotifierRetention keeps finished delivery rows, NotifierDeadRetention dead ones (0: until
	// redriven); HistoryRetention keeps ClickHouse history months (0: for ever).
	NotifierRetention, NotifierDeadRetention, HistoryRetention time.Duration
}

func retentionSettings() []setting {
	// keep parses a retention of at least least, or 0 ("no limit") when forever allows it.
	keep := func(least time.Duration, forever bool, dst func(*Config) *time.Duration) func(*Config, string) error {
		return func(c *Config, v string) error {
			d, err := parseRetention(v)
			switch {
			case err != nil:
				return err
			case d == 0 && forever:
			case d < least && forever:
				return fmt.Errorf("must be at least %s, or 0 for no limit", least)
			case d < least:
				return fmt.Errorf("must be at least %s", least)
			}
			*dst(c) = d
			return nil
		}
	}
	return []setting{
		{"LOCKS_READINGS_MAX_AGE", "0", "age after which READINGS drops readings; 0: kept for ever; else at least 7d and more than LOCKS_LOST_AFTER (docs/operations.md, Retention: what a rebuild then needs)", keep(7*24*time.Hour, true, func(c *Config) *time.Duration { return &c.ReadingsMaxAge.Age })},
		{"LOCKS_EVENTS_MAX_AGE", "0", "age after which EVENTS drops events; 0: kept for ever; else at least 1d", keep(24*time.Hour, true, func(c *Config) *time.Duration { return &c.EventsMaxAge.Age })},
		{"LOCKS_DELIVERIES_MAX_AGE", "7d", "age after which DELIVERIES drops webhook attempt records; at least 1d; 0: kept for ever", keep(24*time.Hour, true, func(c *Config) *time.Duration { return &c.DeliveriesMaxAge.Age })},
		{"LOCKS_NOTIFIER_RETENTION", "7d", "the notifier deletes delivered, superseded and cancelled delivery rows this long after their last change (at least 1h)", keep(time.Hour, false, func(c *Config) *time.Duration { return &c.NotifierRetention })},
		{"LOCKS_NOTIFIER_DEAD_RETENTION", "90d", "the notifier deletes dead-lettered rows not redriven this long after they died (at least 1d; 0: kept until redriven)", keep(24*time.Hour, true, func(c *Config) *time.Duration { return &c.NotifierDeadRetention })},
		{"LOCKS_HISTORY_RETENTION", "0", "the history projector drops whole months of ClickHouse history that ended longer ago than this; 0: kept for ever; else at least 31d", keep(31*24*time.Hour, true, func(c *Config) *time.Duration { return &c.HistoryRetention })},
	}
}

// retentionGiven marks the stream limits the operator gave (given: by variable name), which a
// start then applies to existing streams, and checks READINGS' limit against lost_after.
func (c *Config) retentionGiven(given map[string]bool) error {
	c.ReadingsMaxAge.Set = given["LOCKS_READINGS_MAX_AGE"]
	c.EventsMaxAge.Set = given["LOCKS_EVENTS_MAX_AGE"]
	c.DeliveriesMaxAge.Set = given["LOCKS_DELIVERIES_MAX_AGE"]
	if c.ReadingsMaxAge.Age > 0 && c.ReadingsMaxAge.Age <= c.LostAfter {
		return &Error{Var: "LOCKS_READINGS_MAX_AGE", Value: c.ReadingsMaxAge.Age.String(),
			Reason: "must be longer than LOCKS_LOST_AFTER: the watchdog reads a silent sensor's last reading when it expires"}
	}
	return nil
}

// parseRetention reads a duration, whole days allowed ("30d"), or "0".
func parseRetention(v string) (time.Duration, error) {
	bad := errors.New("not a duration (use e.g. 30d, 720h, or 0)")
	if n, ok := strings.CutSuffix(v, "d"); ok {
		days, err := strconv.Atoi(n)
		if err != nil || days < 0 {
			return 0, bad
		}
		return time.Duration(days) * 24 * time.Hour, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		return 0, bad
	}
	return d, nil
}
