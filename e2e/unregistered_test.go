package e2e_test

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/partition"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// Issue 25, item 9: with LOCKS_UNREGISTERED_MAX=2, the first two unregistered sensors are
// tracked and the next ones are not: their readings are in READINGS (marked untracked),
// counted and logged once, but they get no sensor_state row and no liveness key, and the
// watchdog keeps nothing for them; a registered sensor works as ever, an untracked sensor
// registered later is tracked from its next reading, and a rebuild of the state from the log
// gives the same state.
func TestUnregisteredSensorsBeyondTheBoundAreNotTracked(t *testing.T) {
	t.Parallel()
	const partitions = 4 // what start configures
	natsAddr := testenv.FreeAddr(t)
	dataDir := t.TempDir()
	s := start(t, "LOCKS_NATS_LISTEN="+natsAddr, "LOCKS_DATA_DIR="+dataDir, "LOCKS_UNREGISTERED_MAX=2")
	rcv := newReceiver(t)
	var client struct {
		ID string `json:"id"`
	}
	if code := s.call("POST", "/v1/clients", map[string]string{"name": "owner", "webhook_url": rcv.URL + "/hook"}, &client); code != 200 {
		t.Fatalf("create client: %d", code)
	}
	if code := s.call("POST", "/v1/sensors", map[string]string{"id": "doorReg", "address": "here"}, nil); code != 200 {
		t.Fatalf("register: %d", code)
	}
	if code := s.call("PUT", "/v1/sensors/doorReg/clients/"+client.ID, nil, nil); code != 200 {
		t.Fatalf("subscribe: %d", code)
	}

	// One bridge, one queue: the decisions follow the publishing order.
	strangers := []string{"un1", "un2", "un3", "un4", "un5"}
	var msgs []string
	for _, id := range strangers {
		msgs = append(msgs, reading(id, 1), reading(id, 0))
	}
	msgs = append(msgs, reading("doorReg", 1))
	s.publish(msgs...)
	const total = 11
	if got := rcv.wait(t, 1, 30*time.Second); got[0].payload.Sensor.ID != "doorReg" {
		t.Fatalf("webhook for %s, want doorReg", got[0].payload.Sensor.ID)
	}
	testenv.Eventually(t, 30*time.Second, "state projector and watchdog caught up", func() bool {
		return s.metric("locks_state_applied_total") >= total && s.metric("locks_watchdog_untracked_readings_total") >= 6
	})

	// Counted and logged (one line, not one per reading).
	if n := s.metric("locks_unregistered_untracked_readings_total"); n != 6 {
		t.Fatalf("locks_unregistered_untracked_readings_total = %v, want 6", n)
	}
	if n := s.metric("locks_unregistered_tracked"); n != 2 {
		t.Fatalf("locks_unregistered_tracked = %v, want 2", n)
	}
	if n := s.metric("locks_unregistered_max"); n != 2 {
		t.Fatalf("locks_unregistered_max = %v, want 2", n)
	}
	if n := strings.Count(s.log.String(), "beyond LOCKS_UNREGISTERED_MAX were recorded but not tracked"); n != 1 {
		t.Fatalf("%d log lines about untracked readings, want 1 (the first at once, then one per minute)", n)
	}

	// In READINGS, all of them: the log is the truth.
	auth, err := natsx.EmbeddedAuth(dataDir).Options()
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect("nats://"+natsAddr, auth...)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	readings, err := js.Stream(ctx, natsx.ReadingsStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := readings.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != total {
		t.Fatalf("READINGS holds %d messages, want %d", info.State.Msgs, total)
	}
	for i, id := range strangers {
		m, err := readings.GetLastMsgForSubject(ctx, natsx.ReadingsStoredSubject(partition.Of(id, partitions), id))
		if err != nil {
			t.Fatalf("%s in READINGS: %v", id, err)
		}
		l, err := event.DecodeLog(m.Data)
		if err != nil {
			t.Fatal(err)
		}
		if l.Untracked != (i >= 2) {
			t.Fatalf("%s: untracked %v, want %v", id, l.Untracked, i >= 2)
		}
	}

	// Tracked: doorReg, un1, un2 only, in the state and the liveness keys.
	want := []string{"doorReg", "un1", "un2"}
	if got := stateRows(t, s.pgURL); !slices.Equal(got, want) {
		t.Fatalf("sensor_state rows %v, want %v", got, want)
	}
	testenv.Eventually(t, 10*time.Second, "liveness keys of the tracked sensors", func() bool {
		return slices.Equal(livenessKeys(t, js), want)
	})
	if got := s.metric("locks_watchdog_untracked_readings_total"); got != 6 {
		t.Fatalf("locks_watchdog_untracked_readings_total = %v, want 6", got)
	}

	// Registered now, un4 is tracked from its next reading (the bridge looks it up, at most
	// once per sensor in a few seconds), and the bound does not count it.
	if code := s.call("POST", "/v1/sensors", map[string]string{"id": "un4", "address": "found"}, nil); code != 200 {
		t.Fatalf("register un4: %d", code)
	}
	testenv.Eventually(t, 30*time.Second, "un4 tracked", func() bool {
		s.publish(reading("un4", 1))
		time.Sleep(time.Second)
		return slices.Contains(stateRows(t, s.pgURL), "un4") && slices.Contains(livenessKeys(t, js), "un4")
	})
	var state struct {
		Data       int    `json:"data"`
		Connection string `json:"connection"`
	}
	if code := s.call("GET", "/v1/sensors/un4/state", nil, &state); code != 200 || state.Data != 1 || state.Connection != "CONNECTION_ONLINE" {
		t.Fatalf("un4 state: %d %+v", code, state)
	}
	if n := s.metric("locks_unregistered_tracked"); n != 2 {
		t.Fatalf("locks_unregistered_tracked = %v after un4 was registered, want still 2", n)
	}

	// A rebuild of the state from the log follows the same marks: the same sensors, the
	// same revisions.
	before := stateRevisions(t, s.pgURL)
	if code := s.call("POST", "/v1/projections/state:rebuild", map[string]any{}, nil); code != 200 {
		t.Fatalf("start the state rebuild: %d", code)
	}
	testenv.Eventually(t, 60*time.Second, "state rebuild done", func() bool {
		var res struct {
			Projections []struct {
				Name    string `json:"name"`
				Rebuild *struct {
					Phase string `json:"phase"`
					Error string `json:"error"`
				} `json:"rebuild"`
			} `json:"projections"`
		}
		s.call("GET", "/v1/projections", nil, &res)
		for _, p := range res.Projections {
			if p.Name == "state" && p.Rebuild != nil {
				if p.Rebuild.Phase == "REBUILD_PHASE_FAILED" {
					t.Fatalf("state rebuild failed: %s", p.Rebuild.Error)
				}
				return p.Rebuild.Phase == "REBUILD_PHASE_DONE"
			}
		}
		return false
	})
	if after := stateRevisions(t, s.pgURL); after != before {
		t.Fatalf("after the rebuild, sensor_state %s, want %s as before it", after, before)
	}
}

// stateRevisions is every sensor_state row's sensor, data and revision.
func stateRevisions(t *testing.T, pgURL string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, pgURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var out string
	if err := conn.QueryRow(ctx, `SELECT coalesce(string_agg(sensor_id || ':' || data || ':' || revision, ' ' ORDER BY sensor_id), '') FROM sensor_state`).Scan(&out); err != nil {
		t.Fatal(err)
	}
	return out
}

// stateRows are the sensor ids of sensor_state, sorted.
func stateRows(t *testing.T, pgURL string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, pgURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT sensor_id FROM sensor_state ORDER BY sensor_id`)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// livenessKeys are the sensors that have a key in the liveness bucket, sorted.
func livenessKeys(t *testing.T, js jetstream.JetStream) []string {
	t.Helper()
	kv, err := js.KeyValue(t.Context(), natsx.LivenessBucket)
	if err != nil {
		t.Fatal(err)
	}
	lister, err := kv.ListKeys(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for k := range lister.Keys() {
		p, id, ok := strings.Cut(k, ".")
		if !ok {
			t.Fatalf("liveness key %q", k)
		}
		if _, err := strconv.Atoi(p); err != nil {
			continue // not a sensor's key: the watchdog's position of a partition
		}
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return slices.Compact(ids)
}
