package config_test

import (
	"errors"
	"flag"
	"strings"
	"testing"
	"time"

	"github.com/lock-sensors/lock-sensors/internal/config"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
)

const day = 24 * time.Hour

// Retention variables: documented defaults, whole days, 0 for "no limit" where allowed, a
// floor against values that would break the system, and Set only for stream limits the
// operator gave (by variable or flag), so that only those change an existing stream.
func TestRetention(t *testing.T) {
	t.Parallel()
	want := config.Retention{
		ReadingsMaxAge:        natsx.MaxAge{Age: 0},
		EventsMaxAge:          natsx.MaxAge{Age: 0},
		DeliveriesMaxAge:      natsx.MaxAge{Age: 7 * day},
		NotifierRetention:     7 * day,
		NotifierDeadRetention: 90 * day,
		HistoryRetention:      0,
	}
	if got := config.Default().Retention; got != want {
		t.Fatalf("defaults: %+v, want %+v", got, want)
	}
	load := func(env map[string]string) (config.Config, error) {
		return config.Load(func(k string) string { return env[k] }, nil, nil)
	}
	c, err := load(map[string]string{"LOCKS_READINGS_MAX_AGE": "400d", "LOCKS_EVENTS_MAX_AGE": "0",
		"LOCKS_DELIVERIES_MAX_AGE": "72h", "LOCKS_NOTIFIER_DEAD_RETENTION": "0", "LOCKS_HISTORY_RETENTION": "365d"})
	if err != nil {
		t.Fatal(err)
	}
	want = config.Retention{
		ReadingsMaxAge:        natsx.MaxAge{Age: 400 * day, Set: true},
		EventsMaxAge:          natsx.MaxAge{Age: 0, Set: true},
		DeliveriesMaxAge:      natsx.MaxAge{Age: 72 * time.Hour, Set: true},
		NotifierRetention:     7 * day,
		NotifierDeadRetention: 0,
		HistoryRetention:      365 * day,
	}
	if c.Retention != want {
		t.Fatalf("from the environment: %+v, want %+v", c.Retention, want)
	}
	for env, v := range map[string]string{
		"LOCKS_READINGS_MAX_AGE":        "1d",  // below the 7-day floor
		"LOCKS_EVENTS_MAX_AGE":          "1h",  // below a day
		"LOCKS_NOTIFIER_RETENTION":      "0",   // finished rows have no "for ever"
		"LOCKS_HISTORY_RETENTION":       "10d", // less than a month: every month would go
		"LOCKS_DELIVERIES_MAX_AGE":      "-1h",
		"LOCKS_NOTIFIER_DEAD_RETENTION": "a week",
	} {
		if _, err := load(map[string]string{env: v}); !errors.Is(err, config.ErrUsage) || !strings.Contains(err.Error(), env) {
			t.Errorf("%s=%s: %v, want an error naming the variable", env, v, err)
		}
	}
	if _, err := load(map[string]string{"LOCKS_READINGS_MAX_AGE": "8d", "LOCKS_LOST_AFTER": "200h"}); err == nil ||
		!strings.Contains(err.Error(), "LOCKS_LOST_AFTER") {
		t.Errorf("READINGS kept less than lost_after: %v, want an error naming LOCKS_LOST_AFTER", err)
	}
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	vals := config.Register(fs)
	if err := fs.Parse([]string{"--events-max-age=30d"}); err != nil {
		t.Fatal(err)
	}
	c, err = config.Load(func(string) string { return "" }, fs, vals)
	if err != nil || c.EventsMaxAge != (natsx.MaxAge{Age: 30 * day, Set: true}) || c.DeliveriesMaxAge.Set {
		t.Fatalf("--events-max-age=30d: %+v, %v; want EVENTS 30 days, given, and DELIVERIES not given", c.Retention, err)
	}
}
