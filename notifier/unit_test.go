package notifier

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/lock-sensors/lock-sensors/internal/config"
)

func TestPolicyNext(t *testing.T) {
	t.Parallel()
	def := Policy{Schedule: config.DefaultRetrySchedule}
	short := Policy{Schedule: []time.Duration{200 * time.Millisecond, 400 * time.Millisecond}}
	for _, tc := range []struct {
		name    string
		p       Policy
		attempt int
		want    time.Duration
	}{
		{"default after 1st", def, 1, 10 * time.Second},
		{"default after 2nd", def, 2, time.Minute},
		{"default after 9th", def, 9, 8 * time.Hour},
		{"default after 10th: dead", def, 10, Stop},
		{"short after 1st", short, 1, 200 * time.Millisecond},
		{"short after 2nd", short, 2, 400 * time.Millisecond},
		{"short after 3rd: dead", short, 3, Stop},
		{"attempt 0 is not an attempt", short, 0, Stop},
		{"empty schedule: one attempt", Policy{}, 1, Stop},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.p.Next(tc.attempt); got != tc.want {
				t.Fatalf("Next(%d) = %s, want %s", tc.attempt, got, tc.want)
			}
		})
	}
	if def.Attempts() != 10 {
		t.Fatalf("default schedule allows %d attempts, want 10", def.Attempts())
	}
}

func TestPolicyDelay(t *testing.T) {
	t.Parallel()
	p := Policy{Schedule: []time.Duration{10 * time.Second, time.Minute, time.Hour}}
	for _, tc := range []struct {
		name       string
		attempt    int
		u          float64
		retryAfter time.Duration
		want       time.Duration
	}{
		{"no jitter", 1, 0, 0, 10 * time.Second},
		{"half jitter adds a tenth", 1, 0.5, 0, 11 * time.Second},
		{"jitter at most a fifth", 2, 0.999, 0, time.Minute + 11988*time.Millisecond},
		{"jitter clamped above", 1, 7, 0, 10*time.Second + 1998*time.Millisecond},
		{"negative jitter clamped", 1, -1, 0, 10 * time.Second},
		{"retry-after lengthens", 1, 0, 30 * time.Second, 30 * time.Second},
		{"retry-after never shortens", 2, 0, time.Second, time.Minute},
		{"retry-after bounded by the longest delay", 1, 0, 48 * time.Hour, time.Hour},
		{"last attempt: stop even with retry-after", 4, 0, time.Second, Stop},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := p.Delay(tc.attempt, tc.u, tc.retryAfter); got != tc.want {
				t.Fatalf("Delay(%d, %v, %s) = %s, want %s", tc.attempt, tc.u, tc.retryAfter, got, tc.want)
			}
		})
	}
}

func TestRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name   string
		status int
		h      string
		want   time.Duration
	}{
		{"429 seconds", 429, "120", 2 * time.Minute},
		{"503 seconds", 503, " 5 ", 5 * time.Second},
		{"503 http date", 503, now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second},
		{"date in the past", 503, now.Add(-time.Minute).Format(http.TimeFormat), 0},
		{"500 ignores it", 500, "120", 0},
		{"garbage", 429, "soon", 0},
		{"negative", 429, "-3", 0},
		{"absent", 429, "", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := RetryAfter(tc.status, tc.h, now); got != tc.want {
				t.Fatalf("RetryAfter(%d, %q) = %s, want %s", tc.status, tc.h, got, tc.want)
			}
		})
	}
}

// TestSignatureVector checks the signer against the Standard Webhooks reference vector.
func TestSignatureVector(t *testing.T) {
	t.Parallel()
	got, err := Signature("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "", time.Time{}, time.Now(),
		"msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, []byte(`{"test": 2432232314}`))
	if err != nil {
		t.Fatal(err)
	}
	if want := "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="; got != want {
		t.Fatalf("signature %s, want %s", got, want)
	}
	for _, bad := range []string{"MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_", "whsec_!!!"} {
		if _, err := Signature(bad, "", time.Time{}, time.Now(), "id", 1, nil); !errors.Is(err, ErrSecret) {
			t.Errorf("secret %q: err %v, want ErrSecret", bad, err)
		}
	}
}

// TestSenderRefusesPrivateAndRedirects uses real loopback servers.
func TestSenderRefusesPrivateAndRedirects(t *testing.T) {
	t.Parallel()
	target := newReceiver(t, nil)
	redirect := newReceiver(t, func(_ int, w http.ResponseWriter, _ *http.Request) int {
		w.Header().Set("Location", target.URL)
		return http.StatusFound
	})
	strict := newSender(time.Second, false)
	if _, err := strict.post(t.Context(), target.URL, http.Header{}, []byte("{}")); !errors.Is(err, ErrForbiddenAddress) {
		t.Fatalf("loopback with private addresses disallowed: err %v, want ErrForbiddenAddress", err)
	}
	// Ranges the dial-time check once missed (the whole list is netguard's table test): the
	// dialer refuses them before any packet is sent.
	for _, host := range []string{"198.18.0.1", "192.0.0.8", "240.0.0.1", "[fec0::1]", "[64:ff9b::a00:1]",
		"[2002:7f00:1::1]", "[::10.0.0.1]", "[::ffff:192.168.0.1]"} {
		if _, err := strict.post(t.Context(), "http://"+host+"/hook", http.Header{}, []byte("{}")); !errors.Is(err, ErrForbiddenAddress) {
			t.Errorf("%s: err %v, want ErrForbiddenAddress", host, err)
		}
	}
	if _, err := strict.post(t.Context(), "ftp://example.com/", http.Header{}, nil); !errors.Is(err, ErrBadURL) {
		t.Fatalf("ftp URL: err %v, want ErrBadURL", err)
	}
	lax := newSender(time.Second, true)
	resp, err := lax.post(t.Context(), redirect.URL, http.Header{}, []byte("{}"))
	if err != nil || resp.status != http.StatusFound {
		t.Fatalf("redirect: status %d err %v, want 302 not followed", resp.status, err)
	}
	if target.count() != 0 {
		t.Fatalf("the redirect target got %d requests, want 0", target.count())
	}
	hang := newReceiver(t, func(_ int, _ http.ResponseWriter, r *http.Request) int { <-r.Context().Done(); return 0 })
	quick := newSender(200*time.Millisecond, true)
	start := time.Now()
	if _, err := quick.post(context.Background(), hang.URL, http.Header{}, nil); err == nil {
		t.Fatal("hanging receiver: no error")
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("attempt against a hanging receiver took %s", d)
	}
}

func TestEndpointsBreaker(t *testing.T) {
	t.Parallel()
	es := newEndpoints(2, 3, time.Second, 4*time.Second)
	now := time.Unix(1000, 0)
	if !es.acquire("a", now) || !es.acquire("a", now) {
		t.Fatal("two slots should be free")
	}
	if es.acquire("a", now) {
		t.Fatal("a third concurrent attempt was allowed")
	}
	// Its slots taken, a healthy endpoint may still have rows claimed ahead into its queue,
	// up to queueFactor rounds of its limit; then it is busy.
	if c := es.capacity(now); len(c.busy) != 0 || len(c.free) != 1 || c.free[0] != 2*queueFactor-2 {
		t.Fatalf("capacity = %+v, want a free for %d queued rows", c, 2*queueFactor-2)
	}
	for i := range 2*queueFactor - 2 {
		if !es.enqueue("a", claimed{id: int64(i)}) {
			t.Fatalf("queued row %d refused", i)
		}
	}
	if es.enqueue("a", claimed{id: 99}) {
		t.Fatal("a row queued beyond the depth")
	}
	if b := es.capacity(now).busy; len(b) != 1 || b[0] != "a" {
		t.Fatalf("busy = %v, want [a]", b)
	}
	if _, _, back, _ := es.next("a", true, nil); len(back) != 2*queueFactor-2 {
		t.Fatalf("stopping gave back %d queued rows, want %d", len(back), 2*queueFactor-2)
	}
	es.release("a", false, 0, now)
	es.release("a", false, 0, now)
	if !es.acquire("a", now) {
		t.Fatal("slot after release")
	}
	if !es.release("a", false, 0, now) {
		t.Fatal("third consecutive failure should open the breaker")
	}
	if es.acquire("a", now.Add(999*time.Millisecond)) {
		t.Fatal("open breaker let an attempt through")
	}
	probe := now.Add(time.Second)
	if !es.acquire("a", probe) {
		t.Fatal("half-open breaker refused the probe")
	}
	if es.acquire("a", probe) {
		t.Fatal("half-open breaker let a second attempt beside the probe")
	}
	es.release("a", false, 0, probe) // failed probe: cooldown doubles
	if es.acquire("a", probe.Add(1500*time.Millisecond)) {
		t.Fatal("cooldown did not double after a failed probe")
	}
	probe = probe.Add(2 * time.Second)
	if !es.acquire("a", probe) {
		t.Fatal("second probe refused")
	}
	es.release("a", true, 0, probe)
	if !es.acquire("a", probe) || !es.acquire("a", probe) {
		t.Fatal("a successful probe should close the breaker")
	}
	if !es.acquire("b", probe) {
		t.Fatal("another endpoint was affected")
	}
}

// A receiver that answers fast while using all its slots earns more, up to the cap; a
// failure halves its limit and a slow answer gives a slot back; other endpoints keep theirs.
func TestEndpointsAdaptiveLimit(t *testing.T) {
	t.Parallel()
	es := newEndpoints(8, 5, time.Second, 4*time.Second)
	now := time.Unix(1000, 0)
	fill := func(client string) int {
		n := 0
		for es.acquire(client, now) {
			n++
		}
		return n
	}
	drain := func(client string, n int, ok bool, took time.Duration) {
		for range n {
			es.release(client, ok, took, now)
		}
	}
	if n := fill("fast"); n != 8 {
		t.Fatalf("a new endpoint took %d attempts, want 8", n)
	}
	for range 200 { // saturated rounds answered quickly
		drain("fast", 1, true, time.Millisecond)
		fill("fast")
	}
	drain("fast", maxPerEndpoint, true, time.Millisecond)
	if n := fill("fast"); n != maxPerEndpoint {
		t.Fatalf("a fast, saturated endpoint grew to %d slots, want the cap %d", n, maxPerEndpoint)
	}
	drain("fast", 1, false, time.Millisecond)
	drain("fast", maxPerEndpoint-1, true, time.Millisecond)
	if n := fill("fast"); n >= maxPerEndpoint || n < maxPerEndpoint/2 {
		t.Fatalf("after a failure: %d slots, want fewer than the cap, at least half of it", n)
	}
	drain("fast", es.m["fast"].inflight, true, 2*time.Second) // slow answers
	if n := fill("fast"); n >= maxPerEndpoint/2 {
		t.Fatalf("slow answers left %d slots", n)
	}
	if n := fill("other"); n != 8 {
		t.Fatalf("another endpoint got %d slots, want 8", n)
	}
}
