package natsx_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// Stream age limits: a first start creates READINGS and EVENTS without one and DELIVERIES
// with its default; a later start keeps an operator's limits unless the variable is given,
// and then applies it, lowering or raising; messages past the limit are removed by the server.
func TestDeclareStreamMaxAge(t *testing.T) {
	t.Parallel()
	ns := testenv.NATS(t)
	js, ctx := ns.JS, t.Context()
	maxAges := func() map[string]jetstream.StreamConfig {
		out := map[string]jetstream.StreamConfig{}
		for _, name := range []string{natsx.ReadingsStream, natsx.EventsStream, natsx.DeliveriesStream} {
			s, err := js.Stream(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			out[name] = s.CachedInfo().Config
		}
		return out
	}
	check := func(when string, want map[string]time.Duration) {
		t.Helper()
		for name, cfg := range maxAges() {
			if cfg.MaxAge != want[name] {
				t.Errorf("%s: %s has max age %s, want %s", when, name, cfg.MaxAge, want[name])
			}
			if cfg.MaxAge > 0 && cfg.Duplicates > cfg.MaxAge {
				t.Errorf("%s: %s has a duplicate window %s beyond its max age %s", when, name, cfg.Duplicates, cfg.MaxAge)
			}
		}
	}
	c := natsx.StreamsConfig{Partitions: 2, LostAfter: time.Hour}
	if err := natsx.Declare(ctx, js, c); err != nil {
		t.Fatal(err)
	}
	defaults := map[string]time.Duration{natsx.ReadingsStream: 0,
		natsx.EventsStream: 0, natsx.DeliveriesStream: natsx.DeliveriesMaxAgeDefault}
	check("first start", defaults)

	// The operator edits the limits by hand; a start with the defaults leaves them.
	operator := map[string]time.Duration{natsx.ReadingsStream: 400 * 24 * time.Hour,
		natsx.EventsStream: 90 * 24 * time.Hour, natsx.DeliveriesStream: time.Hour}
	for name, cfg := range maxAges() {
		cfg.MaxAge = operator[name]
		if _, err := js.UpdateStream(ctx, cfg); err != nil {
			t.Fatal(err)
		}
	}
	if err := natsx.Declare(ctx, js, c); err != nil {
		t.Fatal(err)
	}
	check("a start without the variables", operator)

	// Given explicitly, the limits apply: READINGS back to for ever, EVENTS lowered to 2 s
	// (the duplicate window shrinks with it), DELIVERIES raised.
	c.ReadingsMaxAge = natsx.MaxAge{Age: 0, Set: true}
	c.EventsMaxAge = natsx.MaxAge{Age: 2 * time.Second, Set: true}
	c.DeliveriesMaxAge = natsx.MaxAge{Age: 90 * 24 * time.Hour, Set: true}
	if err := natsx.Declare(ctx, js, c); err != nil {
		t.Fatal(err)
	}
	check("a start with the variables", map[string]time.Duration{natsx.ReadingsStream: 0,
		natsx.EventsStream: 2 * time.Second, natsx.DeliveriesStream: 90 * 24 * time.Hour})

	// The server removes what is older than the limit.
	if _, err := js.Publish(ctx, natsx.EventsSubject(0, "S1"), []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "EVENTS to drop a message past its max age", func() bool {
		s, err := js.Stream(ctx, natsx.EventsStream)
		return err == nil && s.CachedInfo().State.Msgs == 0 && s.CachedInfo().State.LastSeq == 1
	})
}
