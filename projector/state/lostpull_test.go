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
