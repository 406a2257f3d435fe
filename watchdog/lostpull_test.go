package watchdog

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/partition"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// A pull answer lost in flight (as with the NATS node the watchdog was connected to) skips
// no reading: every sensor's key comes to stand for its own last reading. Acking a later
// reading of the partition must not ack past the lost one, whose sensor would otherwise keep
// no key (or an old one) and be declared lost while it reports.
func TestWatchdogLostPullAnswerSkipsNoReading(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Minute)
	proxy := testenv.NewNATSProxy(t, e.nats.URL)
	const p = 1
	var sensors []string
	for i := 0; len(sensors) < 8; i++ {
		if id := fmt.Sprintf("lp%d", i); partition.Of(id, testPartitions) == p {
			sensors = append(sensors, id)
		}
	}
	prefix := fmt.Sprintf("$JS.ACK.%s.%s-%d.", natsx.ReadingsStream, DurableDefault, p)
	dropped := proxy.DropNth(prefix, 3)
	e.startOn(Config{LostAfter: time.Minute}, testenv.JetStream(t, proxy.URL, "watchdog"))
	want := map[string]uint64{} // sensor → the stream sequence of its one reading
	for i, id := range sensors {
		if i == 3 {
			select {
			case reply := <-dropped:
				t.Logf("lost in flight: %s", reply)
			case <-time.After(10 * time.Second):
				t.Fatal("the third delivery of the partition never passed the proxy")
			}
		}
		_, seq, err := e.appendSeq(t.Context(), e.nats.JS, id, "")
		if err != nil {
			t.Fatal(err)
		}
		want[id] = seq
		time.Sleep(50 * time.Millisecond) // each in a pull of its own
	}
	kv, err := e.nats.JS.KeyValue(t.Context(), natsx.LivenessBucket)
	if err != nil {
		t.Fatal(err)
	}
	stale := func() []string {
		var out []string
		for id, seq := range want {
			entry, err := kv.Get(t.Context(), keyOf(id, testPartitions))
			if err != nil {
				out = append(out, id+": "+err.Error())
				continue
			}
			var v keyValue
			if err := json.Unmarshal(entry.Value(), &v); err != nil || v.Seq != seq {
				out = append(out, fmt.Sprintf("%s: key for seq %d, want %d", id, v.Seq, seq))
			}
		}
		return out
	}
	// Well within AckWait (30 s): the server never redelivers an acked-past message at all.
	testenv.Eventually(t, 10*time.Second, "every sensor's key standing for its reading", func() bool { return len(stale()) == 0 })
}
