package bridge

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

func TestDecideTracking(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		known, accept bool
		places        int
		want          tracking
	}{
		{true, true, 0, trackKnown},
		{true, false, 0, trackKnown},
		{false, true, 1, trackNew},
		{false, true, 0, trackNone},
		{false, true, -3, trackNone}, // more tracked at load than the bound
		{false, false, 5, trackRefuse},
	} {
		if got := decideTracking(c.known, c.accept, c.places); got != c.want {
			t.Errorf("decideTracking(known %v, accept %v, places %d) = %v, want %v", c.known, c.accept, c.places, got, c.want)
		}
	}
}

// unregisteredReading is a reading of sensor id, unique by its ts.
func unregisteredReading(id string, i int) amqp.Publishing {
	ts := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC).Add(time.Duration(i) * time.Millisecond)
	return amqp.Publishing{Body: fmt.Appendf(nil, `{"sensor_id":%q,"data":1,"ts":%q}`, id, ts.Format(time.RFC3339Nano))}
}

// The bound at the bridge: the first LOCKS_UNREGISTERED_MAX unregistered sensors (in the
// queue's order) and every registered one are appended as they are, the readings of further
// unregistered ones are appended marked untracked, counted, and logged in one line. A bridge
// that starts again counts the unregistered sensors that have state as tracked.
func TestBridgeBoundsUnregisteredSensors(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	if _, err := e.pg.Exec(t.Context(), `INSERT INTO sensors (id, address) VALUES ('reg1', 'here'), ('reg2', 'there')`); err != nil {
		t.Fatal(err)
	}
	var msgs []amqp.Publishing
	order := []string{"un1", "reg1", "un2", "un3", "reg2", "un4", "un1", "un3"}
	for i, id := range order {
		msgs = append(msgs, unregisteredReading(id, i))
	}
	e.publish(t, msgs)
	stop := e.start(t, Config{UnregisteredMax: 2})
	testenv.Eventually(t, time.Minute, "all appended", func() bool { return e.streamMsgs(t) == uint64(len(order)) })
	e.quiesce(t)
	stop()
	logs, _ := e.readings(t)
	got := map[string]bool{}
	for _, l := range logs {
		if u, seen := got[l.SensorID]; seen && u != l.Untracked {
			t.Fatalf("%s: readings marked differently", l.SensorID)
		}
		got[l.SensorID] = l.Untracked
	}
	want := map[string]bool{"un1": false, "reg1": false, "un2": false, "un3": true, "reg2": false, "un4": true}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("untracked per sensor %v, want %v", got, want)
	}
	if n := metricValue(e.bridge.sensors.mUntracked); n != 3 {
		t.Fatalf("locks_unregistered_untracked_readings_total = %v, want 3", n)
	}
	if n := metricValue(e.bridge.sensors.mTracked); n != 2 {
		t.Fatalf("locks_unregistered_tracked = %v, want 2", n)
	}
	if lines := e.logs.lines("were recorded but not tracked"); len(lines) != 1 || !strings.Contains(lines[0], "readings=1") {
		t.Fatalf("log lines about untracked readings %q, want one, at the first", lines)
	}

	// A bridge starting again (a restart, a standby taking over) starts from the state: the
	// unregistered sensors that have a row hold their places.
	if _, err := e.pg.Exec(t.Context(), `INSERT INTO sensor_state (sensor_id, partition, data, last_seen, last_reading_time, changed_at, revision, connection, last_seq)
		VALUES ('un1', 0, 1, now(), now(), now(), 1, 'online', 1), ('un2', 0, 1, now(), now(), now(), 1, 'online', 2), ('reg1', 0, 1, now(), now(), now(), 1, 'online', 3)`); err != nil {
		t.Fatal(err)
	}
	e.publish(t, []amqp.Publishing{unregisteredReading("un5", 100), unregisteredReading("un2", 101)})
	stop = e.start(t, Config{UnregisteredMax: 2})
	testenv.Eventually(t, time.Minute, "all appended", func() bool { return e.streamMsgs(t) == uint64(len(order)+2) })
	e.quiesce(t)
	stop()
	logs, _ = e.readings(t)
	for _, l := range logs[len(order):] {
		if l.Untracked != (l.SensorID == "un5") {
			t.Fatalf("after the restart, %s untracked %v", l.SensorID, l.Untracked)
		}
	}

	// A tracked unregistered sensor that is registered gives its place back at the next
	// refresh, and the next new sensor takes it.
	stop = e.start(t, Config{UnregisteredMax: 2, RegistryRefresh: 100 * time.Millisecond})
	defer func() { stop() }()
	testenv.Eventually(t, 30*time.Second, "the places loaded", func() bool { return metricValue(e.bridge.sensors.mTracked) == 2 })
	if _, err := e.pg.Exec(t.Context(), `INSERT INTO sensors (id, address) VALUES ('un1', 'found')`); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "un1's place given back", func() bool { return metricValue(e.bridge.sensors.mTracked) == 1 })
	e.publish(t, []amqp.Publishing{unregisteredReading("un6", 200)})
	testenv.Eventually(t, time.Minute, "un6 appended", func() bool { return e.streamMsgs(t) == uint64(len(order)+3) })
	logs, _ = e.readings(t)
	if l := logs[len(logs)-1]; l.SensorID != "un6" || l.Untracked {
		t.Fatalf("last reading %+v, want un6 tracked", l)
	}
}

// LOCKS_ACCEPT_UNREGISTERED=false: a reading of a sensor that is not registered goes to the
// invalid queue with its reason, counted as invalid{reason="unregistered"}; registered
// sensors' readings are appended, and a sensor registered after the bridge started is
// accepted once the bridge looks it up.
func TestBridgeRefusesUnregisteredSensors(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	if _, err := e.pg.Exec(t.Context(), `INSERT INTO sensors (id, address) VALUES ('known', 'here')`); err != nil {
		t.Fatal(err)
	}
	e.publish(t, []amqp.Publishing{unregisteredReading("known", 1), unregisteredReading("stranger", 2), unregisteredReading("known", 3)})
	stop := e.start(t, Config{RefuseUnregistered: true})
	defer func() { stop() }()
	testenv.Eventually(t, time.Minute, "handled", func() bool {
		return e.streamMsgs(t) == 2 && e.queueReady(t, e.queue+".invalid") == 1
	})
	d, ok, err := e.ch.Get(e.queue+".invalid", true)
	if err != nil || !ok {
		t.Fatalf("get from invalid queue: %v %v", ok, err)
	}
	if h, _ := d.Headers[ErrorHeader].(string); !strings.Contains(string(d.Body), `"stranger"`) ||
		h != "sensor_id stranger is not registered, and LOCKS_ACCEPT_UNREGISTERED is false" {
		t.Fatalf("invalid queue: %s with %s = %q", d.Body, ErrorHeader, h)
	}
	// The counter moves once RabbitMQ has confirmed the invalid queue's copy, which may be
	// after the copy is already in the queue.
	testenv.Eventually(t, 10*time.Second, "invalid{reason=unregistered} = 1", func() bool {
		return metricValue(e.bridge.m.invalid.WithLabelValues(ReasonUnregistered)) == 1
	})
	if lines := e.logs.lines("were refused (LOCKS_ACCEPT_UNREGISTERED=false)"); len(lines) != 1 {
		t.Fatalf("log lines about refused readings %q, want one", lines)
	}
	logs, _ := e.readings(t)
	for _, l := range logs {
		if l.SensorID != "known" || l.Untracked {
			t.Fatalf("appended %+v", l)
		}
	}

	// Registered while the bridge runs: accepted from a reading after its recheck.
	if _, err := e.pg.Exec(t.Context(), `INSERT INTO sensors (id, address) VALUES ('stranger', 'found')`); err != nil {
		t.Fatal(err)
	}
	i := 10
	testenv.Eventually(t, 30*time.Second, "stranger accepted", func() bool {
		i++
		e.publish(t, []amqp.Publishing{unregisteredReading("stranger", i)})
		time.Sleep(500 * time.Millisecond)
		return e.streamMsgs(t) == 3
	})
	if n := metricValue(e.bridge.sensors.mTracked); n != 0 {
		t.Fatalf("locks_unregistered_tracked = %v, want 0 while unregistered sensors are refused", n)
	}
}

// When the registry cannot be asked in the middle of a session, readings go on: a sensor not
// known to be registered is taken as unregistered (here, with no places, untracked), the
// failure is logged, and the queue is never held up.
func TestBridgeGoesOnWithoutTheRegistry(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	if _, err := e.pg.Exec(t.Context(), `INSERT INTO sensors (id, address) VALUES ('known', 'here')`); err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(t.Context(), e.pgURL)
	if err != nil {
		t.Fatal(err)
	}
	e.pg = pool // the bridge's own, to close under it
	stop := e.start(t, Config{UnregisteredMax: -1})
	defer func() { stop() }()
	e.publish(t, []amqp.Publishing{unregisteredReading("known", 1)})
	testenv.Eventually(t, time.Minute, "the first reading appended", func() bool { return e.streamMsgs(t) == 1 })
	pool.Close()
	e.publish(t, []amqp.Publishing{unregisteredReading("new1", 2), unregisteredReading("known", 3), unregisteredReading("new2", 4)})
	testenv.Eventually(t, time.Minute, "all appended", func() bool { return e.streamMsgs(t) == 4 })
	logs, _ := e.readings(t)
	for _, l := range logs {
		if l.Untracked != (l.SensorID != "known") {
			t.Fatalf("%s untracked %v", l.SensorID, l.Untracked)
		}
	}
	testenv.Eventually(t, 10*time.Second, "the failed lookup logged", func() bool {
		return len(e.logs.lines("registry lookups failed")) == 1
	})
}
