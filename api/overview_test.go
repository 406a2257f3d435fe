package api

import (
	"strconv"
	"testing"
)

// GET /v1/sensors:count counts the registered sensors by connection and last reading; a
// reading of an unregistered sensor is not counted, a registered sensor never heard from is.
func TestSensorCounts(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, id := range []string{"a1", "a2", "a3", "a4"} {
		e.want(e.do("POST", "/v1/sensors", map[string]any{"id": id, "address": "x"}), 200)
	}
	e.setState("a1", 1, "online", 1)
	e.setState("a2", 0, "online", 1)
	e.setState("a3", 1, "lost", 2)
	e.setState("unregistered", 0, "lost", 1)
	r := e.want(e.do("GET", "/v1/sensors:count", nil), 200)
	want := map[string]int{"registered": 4, "online": 2, "lost": 1, "open": 1, "closed": 2, "never_heard": 1}
	for k, v := range want {
		// int64 is a JSON string in protojson.
		if got := r.str(k); got != strconv.Itoa(v) {
			t.Errorf("%s = %q, want %v (%s)", k, got, v, r.raw)
		}
	}
	e.want(e.do("GET", "/v1/sensors:count", nil, "Authorization", ""), 401)
}
