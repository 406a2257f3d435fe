package notifier

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/lock-sensors/lock-sensors/internal/lease"
)

// The headers of an attempt, against the Standard Webhooks spec's example: the signature is
// over id.timestamp.body with the key of the whsec_ secret, and the timestamp is the
// attempt's unix seconds.
func TestHeadersStandardWebhooksVector(t *testing.T) {
	t.Parallel()
	const (
		secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
		id     = "msg_p5jXN8AQM9LWM0D4loKWxJek"
		want   = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
	)
	at := time.Unix(1614265330, 0)
	body := []byte(`{"test": 2432232314}`)
	old := "whsec_" + "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="
	for _, tc := range []struct {
		name string
		s    Secrets
		sig  string
	}{
		{"one secret", Secrets{Current: secret}, want},
		{"previous secret expired", Secrets{Current: secret, Previous: old, PreviousUntil: at}, want},
		{"rotation: both, current first", Secrets{Current: secret, Previous: old, PreviousUntil: at.Add(time.Second)},
			want + " " + mustSign(t, old, id, at, body)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, err := Headers(tc.s, id, at, body)
			if err != nil {
				t.Fatal(err)
			}
			for k, v := range map[string]string{"webhook-id": id, "webhook-timestamp": "1614265330",
				"webhook-signature": tc.sig, "Content-Type": "application/json"} {
				if got := h[k]; len(got) != 1 || got[0] != v {
					t.Errorf("%s = %q, want %q", k, got, v)
				}
			}
		})
	}
	if _, err := Headers(Secrets{Current: "not-a-secret"}, id, at, body); err == nil {
		t.Fatal("a malformed secret signed")
	}
}

func mustSign(t *testing.T, secret, id string, at time.Time, body []byte) string {
	t.Helper()
	s, err := Signature(secret, "", time.Time{}, at, id, at.Unix(), body)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Jitter drawn from a (seeded, so repeatable) random source stretches every delay of the
// schedule by less than a fifth and never shortens it.
func TestPolicyDelayJitterBounds(t *testing.T) {
	t.Parallel()
	p := Policy{Schedule: []time.Duration{10 * time.Second, time.Minute, time.Hour, 8 * time.Hour}}
	src := rand.New(rand.NewPCG(1, 2))
	for attempt := 1; attempt <= len(p.Schedule); attempt++ {
		base := p.Next(attempt)
		lo, hi := base, base+base/5
		seenLow, seenHigh := false, false
		for range 1000 {
			d := p.Delay(attempt, src.Float64(), 0)
			if d < lo || d >= hi {
				t.Fatalf("attempt %d: delay %s outside [%s, %s)", attempt, d, lo, hi)
			}
			seenLow = seenLow || d < base+base/20
			seenHigh = seenHigh || d > base+base*3/20
		}
		if !seenLow || !seenHigh {
			t.Fatalf("attempt %d: 1000 draws never reached both ends of the jitter range", attempt)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	ok := Config{PartitionCount: 4, WebhookTimeout: time.Second}
	ok.setDefaults()
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid config: %v", err)
	}
	// No partitions: this process's share, by leases.
	if len(ok.Partitions) != 0 || ok.LeaseTTL != lease.TTLDefault || ok.Batch != BatchDefault || ok.MaxInFlight != MaxInFlightDefault ||
		ok.BreakerMaxCooldown != BreakerMaxCooldownDefault || ok.Retention != RetentionDefault {
		t.Fatalf("defaults not applied: %+v", ok)
	}
	for name, mod := range map[string]func(*Config){
		"no partitions":        func(c *Config) { c.PartitionCount = 0 },
		"no timeout":           func(c *Config) { c.WebhookTimeout = 0 },
		"negative delay":       func(c *Config) { c.RetrySchedule = []time.Duration{time.Second, -1} },
		"partition out of set": func(c *Config) { c.Partitions = []int{4} },
	} {
		c := ok
		mod(&c)
		if c.Validate() == nil {
			t.Errorf("%s: no error", name)
		}
	}
}
