package ui

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

func TestSigninDelay(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		failures int
		want     time.Duration
	}{
		{0, 0}, {2, 0}, {3, time.Second}, {4, 2 * time.Second}, {6, 8 * time.Second},
		{11, 256 * time.Second}, {12, signinDelayMax}, {1000, signinDelayMax},
	} {
		if got := signinDelay(c.failures); got != c.want {
			t.Errorf("signinDelay(%d) = %s, want %s", c.failures, got, c.want)
		}
	}
}

// newSigninUI is a dashboard on a real NATS server whose clock the test moves, logging
// into logs.
func newSigninUI(t *testing.T, token string) (*UI, *testenv.LogBuffer, *time.Time) {
	t.Helper()
	e := testenv.NATS(t)
	js := testenv.JetStream(t, e.URL, "ui-signin")
	// The sign-in never calls the API: a connection that is never used.
	cc, err := grpc.NewClient("127.0.0.1:1", grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	log, logs := testenv.CaptureLogger()
	u, err := New(Config{Tokens: []string{token}}, Deps{Logger: log, Registerer: prometheus.NewRegistry(), API: cc, JS: js,
		ClientTokens: noClientTokens{}})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 11, 26, 10, 0, 0, 0, time.UTC)
	u.now = func() time.Time { return now }
	return u, logs, &now
}

// noClientTokens knows no client token: these tests sign in with administrator tokens.
type noClientTokens struct{}

func (noClientTokens) ClientOfToken(context.Context, string) (string, error) {
	return "", errors.New("no client tokens here")
}

func signin(u *UI, remote, token string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/ui/login", strings.NewReader(url.Values{"token": {token}}.Encode()))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	r.RemoteAddr = remote
	w := httptest.NewRecorder()
	u.Handler().ServeHTTP(w, r)
	return w
}

// Issue 25, item 5: an address that keeps giving wrong tokens waits longer and longer (429
// with Retry-After; the token is not even read, so the right one is refused too until the
// wait is over); another address is not held up; after the wait the right token signs in
// and clears the address's record.
func TestSigninThrottledByAddress(t *testing.T) {
	t.Parallel()
	const token = "ui-token-0123456789abcdef"
	u, _, now := newSigninUI(t, token)
	const attacker, operator = "203.0.113.7:40000", "198.51.100.2:50000"
	for i := range signinFreeFailures {
		if w := signin(u, attacker, "wrong"); w.Code != http.StatusUnauthorized {
			t.Fatalf("wrong token %d: %d, want 401", i+1, w.Code)
		}
	}
	w := signin(u, attacker, "wrong")
	if w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") != "1" {
		t.Fatalf("after %d wrong tokens: %d Retry-After %q, want 429 and 1", signinFreeFailures, w.Code, w.Header().Get("Retry-After"))
	}
	if w := signin(u, attacker, token); w.Code != http.StatusTooManyRequests {
		t.Fatalf("the right token while throttled: %d, want 429", w.Code)
	}
	if w := signin(u, operator, token); w.Code != http.StatusSeeOther {
		t.Fatalf("another address: %d, want 303", w.Code)
	}
	// The wait grows with each wrong token after it.
	*now = now.Add(time.Second)
	if w := signin(u, attacker, "wrong"); w.Code != http.StatusUnauthorized {
		t.Fatalf("after the wait, a wrong token: %d, want 401", w.Code)
	}
	if w := signin(u, attacker, token); w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") != "2" {
		t.Fatalf("after another wrong token: %d Retry-After %q, want 429 and 2", w.Code, w.Header().Get("Retry-After"))
	}
	*now = now.Add(2 * time.Second)
	if w := signin(u, attacker, token); w.Code != http.StatusSeeOther {
		t.Fatalf("after the wait, the right token: %d, want 303", w.Code)
	}
	if w := signin(u, attacker, "wrong"); w.Code != http.StatusUnauthorized {
		t.Fatalf("a success clears the record; a wrong token then: %d, want 401", w.Code)
	}
}

// A flood of wrong tokens from one address logs one line at once and one line with the count
// per interval, not a line per attempt; many addresses log at most signinLogLines lines and
// a sum per interval.
func TestSigninRefusalsLoggedAggregated(t *testing.T) {
	t.Parallel()
	u, logs, now := newSigninUI(t, "ui-token-0123456789abcdef")
	lines := func() int { return strings.Count(logs.String(), "dashboard sign-in") }
	for range 200 {
		signin(u, "203.0.113.7:40000", "wrong")
	}
	if n := lines(); n != 1 {
		t.Fatalf("200 refusals within an interval logged %d lines, want 1:\n%s", n, logs.String())
	}
	*now = now.Add(signinLogEvery)
	signin(u, "203.0.113.7:40000", "wrong")
	// The count of the interval gone, and the first refusal of the new one.
	if n := lines(); n != 3 {
		t.Fatalf("after the interval: %d lines, want 3 (the first, the count, the next first):\n%s", n, logs.String())
	}
	if !strings.Contains(logs.String(), "wrong_tokens=2 too_early=197") {
		t.Fatalf("the count line does not sum the interval's refusals:\n%s", logs.String())
	}

	before := lines()
	*now = now.Add(signinLogEvery)
	for i := range 50 {
		signin(u, fmt.Sprintf("192.0.2.1:%d", 1000+i), "wrong") // one address, many ports
		signin(u, fmt.Sprintf("10.9.%d.1:1", i), "wrong")
	}
	*now = now.Add(signinLogEvery)
	signin(u, "10.200.0.1:1", "wrong")
	// Per interval, at most signinLogLines first lines, signinLogLines count lines and a sum.
	if n := lines() - before; n > 3*signinLogLines+1 {
		t.Fatalf("%d lines for 52 addresses over two intervals, want at most %d:\n%s", n, 3*signinLogLines+1, logs.String())
	}
	if !strings.Contains(logs.String(), "from more addresses") {
		t.Fatalf("no sum of the addresses beyond the %d lines:\n%s", signinLogLines, logs.String())
	}
}
