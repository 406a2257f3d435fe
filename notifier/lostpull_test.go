package notifier

import (
	"fmt"
	"testing"
	"time"

	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/partition"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// A pull answer lost in flight (as with the NATS node the notifier was connected to) neither
// delays nor reorders a sensor's webhooks: the notifier notices the gap in its consumer's
// sequence and reads again from the last event it took in at once, rather than the server
// redelivering the lost one after AckWait (30 s), when later revisions were already sent and
// it could only be superseded.
func TestNotifierLostPullAnswerKeepsOrder(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rc := newReceiver(t, nil)
	e.subscribed(rc.URL)
	proxy := testenv.NewNATSProxy(t, e.nats.URL)
	prefix := fmt.Sprintf("$JS.ACK.%s.notifier-%d.", natsx.EventsStream, partition.Of("s1", testPartitions))
	dropped := proxy.DropNth(prefix, 3)
	e.startOn(testenv.JetStream(t, proxy.URL, "notifier"))
	const revs = 8
	for rev := int64(1); rev <= 3; rev++ {
		e.publish(testEvent("s1", rev, uint8(rev%2)))
	}
	select {
	case reply := <-dropped:
		t.Logf("lost in flight: %s", reply)
	case <-time.After(10 * time.Second):
		t.Fatal("the third delivery of the partition never passed the proxy")
	}
	for rev := int64(4); rev <= revs; rev++ {
		time.Sleep(50 * time.Millisecond) // each in a pull of its own, as at a moderate rate
		e.publish(testEvent("s1", rev, uint8(rev%2)))
	}
	// Well within AckWait: a notifier that waits for the server's redelivery fails here.
	testenv.Eventually(t, 10*time.Second, "every revision delivered", func() bool { return rc.count() >= revs })
	var got []int64
	for _, h := range rc.got() {
		got = append(got, bodyOf(t, h).Revision)
	}
	if fmt.Sprint(got) != "[1 2 3 4 5 6 7 8]" {
		t.Fatalf("the receiver got revisions %v, want 1 to %d once each in order", got, revs)
	}
	var superseded int
	if err := e.pool.QueryRow(t.Context(), `SELECT count(*) FROM notifier_deliveries WHERE state = 'superseded'`).Scan(&superseded); err != nil {
		t.Fatal(err)
	}
	if superseded != 0 {
		t.Fatalf("%d deliveries superseded", superseded)
	}
}
