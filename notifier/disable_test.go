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
