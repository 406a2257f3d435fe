package bridge

import (
	"fmt"
	"slices"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// TestBridgeAppendsInAtomicBatches: with READINGS allowing atomic batches, a backlog of
// 3,000 readings of 30 sensors goes in batches of several readings, none fails, and every
// sensor's readings are in READINGS once each, in the order sent.
func TestBridgeAppendsInAtomicBatches(t *testing.T) {
	if !atomicBatches {
		t.Skip("LOCKS_TEST_BRIDGE_BATCHES=false: READINGS does not allow atomic batches in this run")
	}
	t.Parallel()
	e := newEnv(t, "")
	const sensors, n = 30, 3000
	var msgs []amqp.Publishing
	want := map[string][]uint8{}
	for i := range n {
		s := fmt.Sprintf("s%d", i%sensors)
		d := uint8(i / sensors % 2)
		want[s] = append(want[s], d)
		msgs = append(msgs, amqp.Publishing{MessageId: fmt.Sprint(i), Body: fmt.Appendf(nil, `{"sensor_id":%q,"data":%d}`, s, d)})
	}
	e.publish(t, msgs)
	stop := e.start(t, Config{})
	testenv.Eventually(t, time.Minute, "readings appended", func() bool { return e.streamMsgs(t) >= n })
	e.quiesce(t)
	stop()
	if got := perSensor(t, e); !mapsEqual(got, want) {
		t.Fatalf("READINGS per sensor differ from what was sent")
	}
	batches, failures := metricValue(e.bridge.m.batches), metricValue(e.bridge.m.batchFailures)
	t.Logf("%d readings in %v batches, %v failed", n, batches, failures)
	if batches == 0 || batches >= n/2 || failures != 0 {
		t.Fatalf("%v batches (%v failed) for %d readings: want batches of several readings, none failed", batches, failures, n)
	}
	if d := metricValue(e.bridge.m.duplicates); d != 0 {
		t.Fatalf("duplicates %v, want 0", d)
	}
}

// TestBridgeBatchWithARepeatedIDFallsBack: a batch holding a reading already recorded (its
// Nats-Msg-Id in the stream, or twice in the batch) is refused whole by the server; each of
// its readings is then appended alone, the repeated one recognised as a duplicate, the
// others recorded once, in order.
func TestBridgeBatchWithARepeatedIDFallsBack(t *testing.T) {
	if !atomicBatches {
		t.Skip("LOCKS_TEST_BRIDGE_BATCHES=false: READINGS does not allow atomic batches in this run")
	}
	t.Parallel()
	e := newEnv(t, "")
	pub := func(sensor, id string, data int) amqp.Publishing {
		return amqp.Publishing{MessageId: id, Body: fmt.Appendf(nil, `{"sensor_id":%q,"data":%d}`, sensor, data)}
	}
	var first, second []amqp.Publishing
	for i := range 50 {
		first = append(first, pub(fmt.Sprintf("f%d", i), "1", i%2))
	}
	second = append(second, pub("f7", "1", 1)) // f7's message 1 again: recorded in the first run
	for i := range 50 {
		second = append(second, pub(fmt.Sprintf("g%d", i), "1", 1), pub(fmt.Sprintf("g%d", i), "2", 0))
	}
	e.publish(t, first)
	stop := e.start(t, Config{})
	testenv.Eventually(t, time.Minute, "first readings appended", func() bool { return e.streamMsgs(t) >= 50 })
	e.quiesce(t)
	stop()
	e.publish(t, second)
	stop = e.start(t, Config{})
	testenv.Eventually(t, time.Minute, "second readings appended", func() bool { return e.streamMsgs(t) >= 150 })
	e.quiesce(t)
	stop()
	got := perSensor(t, e)
	if len(got) != 100 || !slices.Equal(got["f7"], []uint8{1}) || !slices.Equal(got["g3"], []uint8{1, 0}) {
		t.Fatalf("READINGS per sensor: %d sensors, f7 %v, g3 %v; want 100 sensors, f7 [1], g3 [1 0]", len(got), got["f7"], got["g3"])
	}
	for s, ds := range got {
		if s[0] == 'g' && !slices.Equal(ds, []uint8{1, 0}) {
			t.Fatalf("sensor %s: %v, want [1 0]", s, ds)
		}
	}
	if d := metricValue(e.bridge.m.duplicates); d != 1 {
		t.Fatalf("duplicates %v, want 1 (f7's message 1 sent again)", d)
	}
	if f := metricValue(e.bridge.m.batchFailures); f < 1 {
		t.Fatalf("no batch failed: the repeated reading must have been refused in its batch")
	}
}
