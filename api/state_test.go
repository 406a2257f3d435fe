package api

import (
	"testing"
	"time"

	locksv1 "github.com/lock-sensors/lock-sensors/proto/locks/v1"
)

// Every sensor state says how fresh its last_seen_time is (LOCKS_STATE_SEEN_INTERVAL), the
// same over REST and gRPC, in the state call and in the lists.
func TestStateStatesItsSeenBound(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		interval time.Duration
		rest     string
	}{{5 * time.Second, "5s"}, {0, "0s"}} {
		t.Run(tc.rest, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, func(c *Config, _ *Deps) { c.StateSeenInterval = tc.interval })
			e.want(e.do("POST", "/v1/sensors", map[string]any{"id": "Seen1", "address": "Seen st. 1"}), 200)
			e.setState("Seen1", 1, "online", 1)

			r := e.want(e.do("GET", "/v1/sensors/Seen1/state", nil), 200)
			if r.str("last_seen_bound") != tc.rest || r.str("last_seen_time") == "" {
				t.Errorf("REST state: %s, want last_seen_bound %q", r.raw, tc.rest)
			}
			r = e.want(e.do("GET", "/v1/sensors", nil), 200)
			if list, _ := r.body["sensors"].([]any); len(list) != 1 || list[0].(map[string]any)["state"].(map[string]any)["last_seen_bound"] != tc.rest {
				t.Errorf("REST list: %s, want each state's last_seen_bound %q", r.raw, tc.rest)
			}
			st, err := e.state.GetSensorState(t.Context(), &locksv1.GetSensorStateRequest{SensorId: "Seen1"})
			if err != nil || st.GetState().GetLastSeenBound() == nil || st.GetState().GetLastSeenBound().AsDuration() != tc.interval {
				t.Errorf("gRPC state: %v %v, want last_seen_bound %s", st, err, tc.interval)
			}
			ls, err := e.sensors.ListSensors(t.Context(), &locksv1.ListSensorsRequest{})
			if err != nil || len(ls.GetSensors()) != 1 || ls.GetSensors()[0].GetState().GetLastSeenBound().AsDuration() != tc.interval {
				t.Errorf("gRPC list: %v %v, want last_seen_bound %s", ls, err, tc.interval)
			}
		})
	}
}
