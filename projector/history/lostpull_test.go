package history

import (
	"fmt"
	"testing"
	"time"

	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/partition"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// A pull answer lost in flight (as with the NATS node the projector was connected to) is
// written at once: every reading of the partition is in ClickHouse exactly once well before
// AckWait, after which the server would redeliver it.
func TestHistoryLostPullAnswerWritesEveryReading(t *testing.T) {
	t.Parallel()
	e := newHistoryEnv(t)
	proxy := testenv.NewNATSProxy(t, e.nats.URL)
	logs := historyReadings(1, 8, time.Now().UTC().Truncate(time.Second), 0) // sensor s0 only
	p := partition.Of("s0", historyPartitions)
	prefix := fmt.Sprintf("$JS.ACK.%s.%s.", natsx.ReadingsStream, readingsConsumer(DurableDefault, p))
	dropped := proxy.DropNth(prefix, 3)
	cfg := historyTestConfig()
	cfg.AckWait = time.Minute
	runHistory(t, cfg, testenv.JetStream(t, proxy.URL, "history"), e.ch)
	for i := range logs {
		if i == 3 {
			select {
			case <-dropped:
			case <-time.After(10 * time.Second):
				t.Fatal("the third delivery of the partition never passed the proxy")
			}
		}
		historyPublish(t, e.nats.JS, logs[i:i+1])
		time.Sleep(50 * time.Millisecond) // each in a pull of its own
	}
	historyWaitRows(t, e.ch, uint64(len(logs)), 10*time.Second)
	historyCheckExactlyOnce(t, e.ch, logs, 3)
}
