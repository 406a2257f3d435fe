package notifier

import (
	"testing"
	"time"
)

// TestHealthOf: per client, the last success of a batch and the first failure after it;
// aborted attempts and cancellations say nothing about the endpoint.
func TestHealthOf(t *testing.T) {
	t0 := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	r := func(client string, s int, state string) result {
		return result{c: claimed{clientID: client}, at: at(s), state: state, errText: "x"}
	}
	aborted := r("a", 9, StatePending)
	aborted.aborted = true
	for _, tc := range []struct {
		name         string
		rs           []result
		okAt, failAt int // -1: none
	}{
		{"failures only", []result{r("a", 2, StatePending), r("a", 1, StateDead)}, -1, 1},
		{"fail, ok, fail", []result{r("a", 1, StatePending), r("a", 3, StatePending), r("a", 2, StateDelivered)}, 2, 3},
		{"ends with a success", []result{r("a", 1, StatePending), r("a", 2, StateDelivered)}, 2, -1},
		{"cancelled and aborted ignored", []result{r("a", 1, StateDelivered), r("a", 2, StateCancelled), aborted}, 1, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hs := healthOf(tc.rs)
			if len(hs) != 1 || hs[0].client != "a" {
				t.Fatalf("health %+v", hs)
			}
			h := hs[0]
			if (tc.okAt < 0) != (h.lastOK == nil) || tc.okAt >= 0 && !h.lastOK.Equal(at(tc.okAt)) {
				t.Errorf("lastOK %v, want second %d", h.lastOK, tc.okAt)
			}
			if (tc.failAt < 0) != (h.failSince == nil) || tc.failAt >= 0 && !h.failSince.Equal(at(tc.failAt)) {
				t.Errorf("failSince %v, want second %d", h.failSince, tc.failAt)
			}
		})
	}
	if hs := healthOf([]result{r("b", 1, StatePending), r("a", 1, StatePending)}); len(hs) != 2 || hs[0].client != "a" {
		t.Errorf("clients not in lock order: %+v", hs)
	}
}

// TestDisableVerdict is the auto-disable decision: a client whose endpoint failed every
// attempt for LOCKS_ENDPOINT_DISABLE_AFTER or longer is disabled, with the reason recorded.
func TestDisableVerdict(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 5, 1, 12, 0, 0, 0, time.UTC)
	ago := func(d time.Duration) *time.Time { at := now.Add(-d); return &at }
	for _, tc := range []struct {
		name         string
		failingSince *time.Time
		lastErr      string
		after        time.Duration
		disable      bool
		reason       string
	}{
		{"never when disabling is off", ago(1000 * time.Hour), "HTTP 502", 0, false, ""},
		{"not failing", nil, "", time.Hour, false, ""},
		{"failing for less", ago(time.Hour - time.Nanosecond), "HTTP 502", time.Hour, false, ""},
		{"failing for exactly after", ago(time.Hour), "HTTP 502", time.Hour, true,
			"every attempt failed since 2030-05-01T11:00:00Z, for longer than 1h0m0s (LOCKS_ENDPOINT_DISABLE_AFTER); last: HTTP 502"},
		{"failing for longer, no error text", ago(25*time.Hour + 1500*time.Millisecond), "", 24 * time.Hour, true,
			"every attempt failed since 2030-04-30T10:59:58Z, for longer than 24h0m0s (LOCKS_ENDPOINT_DISABLE_AFTER); last: no 2xx answer"},
		{"failing since the future (clock skew)", ago(-time.Minute), "HTTP 502", time.Nanosecond, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			reason, disable := disableVerdict(tc.failingSince, tc.lastErr, tc.after, now)
			if disable != tc.disable || reason != tc.reason {
				t.Fatalf("disableVerdict = (%q, %v), want (%q, %v)", reason, disable, tc.reason, tc.disable)
			}
		})
	}
}

// TestFinishDisablesAtNow is disableVerdict's wiring: finish records each endpoint's
// failing_since (carried over from earlier batches, restarted by a success) and disables,
// at the time it is given, the clients failing for DisableAfter, except those an operator
// disabled meanwhile, without waiting for the time to pass.
func TestFinishDisablesAtNow(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, c := range []string{"c1", "c2", "c3"} {
		e.client(c, "http://127.0.0.1:1/")
	}
	e.exec(`UPDATE clients SET disabled_at = now(), disabled_reason = 'operator' WHERE id = 'c2'`)
	t0 := time.Date(2030, 5, 1, 12, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	// Results of rows no longer leased: finish writes no outcome for them, only the health.
	r := func(client string, when time.Time, state string) result {
		return result{c: claimed{id: -1, clientID: client, sensorID: "s1"}, at: when, state: state, status: 502, errText: "HTTP 502"}
	}
	fin := func(now time.Time, rs ...result) map[string]string {
		t.Helper()
		fd, err := finish(t.Context(), e.pool, rs, time.Hour, now)
		if err != nil {
			t.Fatal(err)
		}
		return fd.disabled
	}
	if d := fin(at(59*time.Minute), r("c1", t0, StatePending), r("c2", t0, StatePending), r("c3", t0, StatePending)); len(d) != 0 {
		t.Fatalf("disabled %v before an hour of failures", d)
	}
	ok := r("c3", at(time.Minute), StateDelivered)
	d := fin(at(time.Hour), r("c1", at(time.Hour), StateDead), r("c2", at(time.Hour), StatePending), ok, r("c3", at(2*time.Minute), StatePending))
	want := "every attempt failed since 2030-05-01T12:00:00Z, for longer than 1h0m0s (LOCKS_ENDPOINT_DISABLE_AFTER); last: HTTP 502"
	if len(d) != 1 || d["c1"] != want {
		t.Fatalf("disabled %v, want only c1: %s", d, want)
	}
	for client, reason := range map[string]string{"c1": want, "c2": "operator"} {
		if at, got := e.disabled(client); at == nil || got == nil || *got != reason {
			t.Errorf("%s: disabled at %v for %v, want %q", client, at, got, reason)
		}
	}
	if at, _ := e.disabled("c3"); at != nil {
		t.Errorf("c3 disabled, but a success restarted its count")
	}
}
