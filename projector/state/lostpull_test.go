package state

import (
	"fmt"
	"testing"
	"time"

	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/partition"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// A pull answer lost in flight (as with the NATS node the projector was connected to) is
// applied at once and in order: the state ends as the readings say, each change one
// revision, and EVENTS holds the sensor's revisions 1..n in order — well before AckWait.
func TestStateLostPullAnswerAppliesInOrder(t *testing.T) {
	t.Parallel()
	e := newStateEnv(t, 4)
	proxy := testenv.NewNATSProxy(t, e.nats.URL)
	p := partition.Of("s1", e.n)
	prefix := fmt.Sprintf("$JS.ACK.%s.%s.", natsx.ReadingsStream, consumerName(p))
	dropped := proxy.DropNth(prefix, 3)
	e.runState(t, testenv.JetStream(t, proxy.URL, "state"), partition.All(e.n))
	var pub statePublished
	const readings = 8
	t0 := time.Now().UTC()
	for i := range readings {
		if i == 3 {
			select {
			case <-dropped:
			case <-time.After(10 * time.Second):
				t.Fatal("the third delivery of the partition never passed the proxy")
			}
		}
		at := t0.Add(time.Duration(i) * time.Millisecond)
		e.publish(t, e.nats.JS, []event.Log{{V: event.Version, Kind: event.KindReading, SensorID: "s1", Data: uint8(i % 2),
			Time: at, ReceivedTime: at, MessageID: fmt.Sprint("m", i)}}, &pub)
		time.Sleep(50 * time.Millisecond) // each in a pull of its own
	}
	e.waitCaughtUp(t, &pub, 10*time.Second)
	var rev int64
	var data int16
	if err := e.pg.QueryRow(t.Context(), `SELECT revision, data FROM sensor_state WHERE sensor_id = 's1'`).Scan(&rev, &data); err != nil {
		t.Fatal(err)
	}
	if rev != readings || data != (readings-1)%2 {
		t.Fatalf("state revision %d data %d, want %d and %d", rev, data, readings, (readings-1)%2)
	}
	var got []int64
	for _, ev := range readStateEvents(t, e.nats.JS) {
		got = append(got, ev.Revision)
	}
	if fmt.Sprint(got) != "[1 2 3 4 5 6 7 8]" {
		t.Fatalf("EVENTS revisions %v, want 1..%d in order", got, readings)
	}
}

// A run that breaks while readings wait in memory (liveness deferred, the checkpoint behind
// them) resumes after what memory applied: those readings are not read again, no
// transaction replays their liveness, and when it is due it is written as the log says.
func TestStateBrokenRunKeepsWhatMemoryApplied(t *testing.T) {
	t.Parallel()
	e, clk := newHeldStateEnv(t, 1)
	proxy := testenv.NewNATSProxy(t, e.nats.URL)
	e.runState(t, testenv.JetStream(t, proxy.URL, "state"), partition.All(e.n))
	reading := heldReadings()
	var pub statePublished
	e.publish(t, e.nats.JS, []event.Log{reading("a", 0, 0), reading("b", 0, 1)}, &pub)
	e.waitCaughtUp(t, &pub, 10*time.Second)
	before := e.commits(t)

	// Repeats, each in a pull of its own; the fourth delivery from now is lost in flight.
	dropped := proxy.DropNth(fmt.Sprintf("$JS.ACK.%s.%s.", natsx.ReadingsStream, consumerName(0)), 4)
	const repeats = 8
	for k := range repeats {
		e.publish(t, e.nats.JS, []event.Log{reading([]string{"a", "b"}[k%2], 0, 2+k)}, &pub)
		testenv.Eventually(t, 10*time.Second, "the repeat applied", func() bool { return e.appliedSeqs(t)[0] == pub.maxSeq[0] })
	}
	select {
	case <-dropped:
	default:
		t.Fatal("the proxy lost nothing: the test shows nothing")
	}
	if n := e.commits(t) - before; n != 0 {
		t.Errorf("%d transactions after the broken run, want none: memory kept what it applied", n)
	}
	if v := stateCounterValueOf(t, e, "locks_state_seen_replayed_total"); v != 0 {
		t.Errorf("locks_state_seen_replayed_total %.0f, want 0", v)
	}
	clk.Add(e.seen)
	waitRowsExact(t, e, &pub, 5*time.Second)
	checkStateAgainstModel(t, e, &pub)
}
