package notifier

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/lock-sensors/lock-sensors/internal/crashpoint"
	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/partition"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

func TestResumeFrom(t *testing.T) {
	t.Parallel()
	cur := natsx.Extent{ID: "B", First: 10, Last: 100}
	for _, tc := range []struct {
		name  string
		pos   position
		found bool
		floor uint64
		want  uint64
		v     resumeVerdict
	}{
		{"after the position", position{50, "B"}, true, 0, 51, resumeAfter},
		{"at the stream's end", position{100, "B"}, true, 0, 101, resumeAfter},
		{"nothing taken in yet", position{0, "B"}, true, 0, 10, resumeAfter},
		{"behind the stream's first message (retention)", position{3, "B"}, true, 0, 10, resumeAfter},
		{"another stream, even ahead of this one's end", position{500, "A"}, true, 0, 10, resumeOtherStream},
		{"another stream, within this one", position{50, "A"}, true, 0, 10, resumeOtherStream},
		{"past the end of its stream", position{150, "B"}, true, 0, 101, resumeAhead},
		{"none: after the consumer's ack floor", position{}, false, 60, 61, resumeFloor},
		{"none and no consumer: the stream's first message", position{}, false, 0, 10, resumeFloor},
		{"none, a floor past the end", position{}, false, 120, 101, resumeFloor},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, v := resumeFrom(tc.pos, tc.found, tc.floor, cur)
			if got != tc.want || v != tc.v {
				t.Fatalf("resumeFrom(%+v, %v, %d) = %d, %d; want %d, %d", tc.pos, tc.found, tc.floor, got, v, tc.want, tc.v)
			}
		})
	}
	if got, _ := resumeFrom(position{}, false, 0, natsx.Extent{ID: "new"}); got != 1 {
		t.Fatalf("an empty stream: %d, want 1", got)
	}
}

// positionOf reads partition p's position; the zero position when it has none.
func (e *env) positionOf(p int) position {
	e.t.Helper()
	pos, _, err := readPosition(e.t.Context(), e.pool, p)
	if err != nil {
		e.t.Fatal(err)
	}
	return pos
}

// eventsStream is EVENTS as it is now.
func (e *env) eventsStream() natsx.Extent {
	e.t.Helper()
	st, err := natsx.Stream(e.t.Context(), e.nats.JS, natsx.EventsStream)
	if err != nil {
		e.t.Fatal(err)
	}
	info := st.CachedInfo()
	return natsx.ExtentOf(info)
}

// newSubscribedEnv is newEnv with sensors s1..sN, each subscribed by the client c1, whose
// webhooks go to the receiver returned.
func newSubscribedEnv(t *testing.T, n int) (*env, *receiver) {
	e := newEnv(t)
	rc := newReceiver(t, nil)
	e.client("c1", rc.URL)
	e.exec(`INSERT INTO sensors (id, address) SELECT 's' || i, 'here' FROM generate_series(1, $1::int) i`, n)
	e.exec(`INSERT INTO subscriptions (client_id, sensor_id) SELECT 'c1', 's' || i FROM generate_series(1, $1::int) i`, n)
	return e, rc
}

// waitWebhooks waits until rc got at least n webhooks.
func waitWebhooks(t testing.TB, rc *receiver, n int, within time.Duration) {
	t.Helper()
	testenv.Eventually(t, within, fmt.Sprint(n, " webhooks"), func() bool { return rc.count() >= n })
}

// publishRev publishes revision rev of s1..sN, in that order.
func (e *env) publishRev(n int, rev int64) {
	e.t.Helper()
	var evs []event.Event
	for i := 1; i <= n; i++ {
		evs = append(evs, testEvent(fmt.Sprintf("s%d", i), rev, uint8(rev%2)))
	}
	e.publish(evs...)
}

// revisions is what rc got, by sensor, in order of arrival.
func (rc *receiver) revisions(t testing.TB) map[string][]int64 {
	out := map[string][]int64{}
	for _, h := range rc.got() {
		b := bodyOf(t, h)
		out[b.Sensor.ID] = append(out[b.Sensor.ID], b.Revision)
	}
	return out
}

// checkRevisions fails t unless each of s1..sN got exactly revisions want, in order.
func checkRevisions(t testing.TB, rc *receiver, n int, want ...int64) {
	t.Helper()
	got := rc.revisions(t)
	for i := 1; i <= n; i++ {
		if s := fmt.Sprintf("s%d", i); !slices.Equal(got[s], want) {
			t.Errorf("sensor %s got revisions %v, want %v", s, got[s], want)
		}
	}
	if len(got) != n {
		t.Errorf("webhooks of %d sensors, want %d", len(got), n)
	}
}

// waitTakenIn waits until every partition's position is at its last EVENTS message and the
// deliveries are all delivered: nothing more is coming.
func (e *env) waitTakenIn(within time.Duration) {
	e.t.Helper()
	testenv.Eventually(e.t, within, "every EVENTS message taken in and delivered", func() bool {
		var pending int
		if err := e.pool.QueryRow(e.t.Context(), `SELECT count(*) FROM notifier_deliveries WHERE state <> 'delivered'`).Scan(&pending); err != nil || pending > 0 {
			return false
		}
		st, err := natsx.Stream(e.t.Context(), e.nats.JS, natsx.EventsStream)
		if err != nil {
			return false
		}
		for p := range testPartitions {
			var last uint64
			m, err := st.GetLastMsgForSubject(e.t.Context(), natsx.EventsPartitionFilter(p))
			switch {
			case err == nil:
				last = m.Sequence
			case !errors.Is(err, jetstream.ErrMsgNotFound):
				return false
			}
			if pos := e.positionOf(p); pos.seq < last {
				return false
			}
		}
		return true
	})
}

// The partitions' EVENTS consumers keep their state in memory (the position is in
// Postgres), so the NATS server keeps no consumer state file for them to rewrite.
func TestNotifierConsumerInMemory(t *testing.T) {
	t.Parallel()
	e, rc := newSubscribedEnv(t, 8)
	e.start()
	e.publishRev(8, 1)
	waitWebhooks(t, rc, 8, 20*time.Second)
	e.waitTakenIn(20 * time.Second)
	for p := range testPartitions {
		c, err := e.nats.JS.Consumer(t.Context(), natsx.EventsStream, consumerName(p))
		if err != nil {
			t.Fatal(err)
		}
		if !c.CachedInfo().Config.MemoryStorage {
			t.Errorf("consumer %s keeps its state on disk", consumerName(p))
		}
	}
	stream := filepath.Join(e.nats.Server.StoreDir(), "*", "streams", natsx.EventsStream)
	if found, err := filepath.Glob(stream); err != nil || len(found) != 1 {
		t.Fatalf("EVENTS in the NATS store: %v %v, want one directory", found, err)
	}
	dirs, err := filepath.Glob(filepath.Join(stream, "obs", "notifier-*"))
	if err != nil {
		t.Fatal(err)
	}
	if len(dirs) > 0 {
		t.Errorf("consumer state directories in the NATS store: %v", dirs)
	}
	checkRevisions(t, rc, 8, 1)
}

// SIGKILLed, with NATS restarted (the memory consumers gone with it) and the delivered rows
// removed as retention does, a new notifier resumes at the positions: the new events are
// delivered once each, and none of the old ones again (their rows, which would have made a
// second intake a no-op, are gone: only the position keeps them from being sent twice).
func TestNotifierRestartResumesAtPosition(t *testing.T) {
	t.Parallel()
	const sensors = 20
	e, rc := newSubscribedEnv(t, sensors)
	first := e.child("100ms", "")
	e.publishRev(sensors, 1)
	waitWebhooks(t, rc, sensors, 30*time.Second)
	e.waitTakenIn(30 * time.Second)
	first.Kill()
	e.exec(`DELETE FROM notifier_deliveries`)
	e.nats.Restart(300 * time.Millisecond)
	e.publishRev(sensors, 2)

	second := e.child("100ms", "")
	waitWebhooks(t, rc, 2*sensors, 40*time.Second)
	e.waitTakenIn(20 * time.Second)
	checkRevisions(t, rc, sensors, 1, 2)
	second.Stop(t, 20*time.Second)
}

// A new NATS store with the old database: EVENTS is created anew, its sequences start again
// at 1, below the positions of the old stream. Each partition reads the new stream from its
// start (a position taken for this stream's would skip its first events) and its position
// then names the new stream.
func TestNotifierPositionOfAnotherStream(t *testing.T) {
	t.Parallel()
	const sensors = 12
	e, rc := newSubscribedEnv(t, sensors)
	e.start()
	e.publishRev(sensors, 1)
	waitWebhooks(t, rc, sensors, 20*time.Second)
	e.waitTakenIn(20 * time.Second)
	e.stop()
	old := e.eventsStream()

	if err := e.nats.JS.DeleteStream(t.Context(), natsx.EventsStream); err != nil {
		t.Fatal(err)
	}
	if err := natsx.Declare(t.Context(), e.nats.JS, natsx.StreamsConfig{Partitions: testPartitions, LostAfter: time.Hour}); err != nil {
		t.Fatal(err)
	}
	cur := e.eventsStream()
	if cur.ID == old.ID {
		t.Fatal("the new EVENTS stream has the old one's identity")
	}
	e.publishRev(sensors, 2)
	e.start()
	waitWebhooks(t, rc, 2*sensors, 20*time.Second)
	e.waitTakenIn(20 * time.Second)
	checkRevisions(t, rc, sensors, 1, 2)
	for p := range testPartitions {
		if pos := e.positionOf(p); pos.stream != cur.ID {
			t.Errorf("partition %d: position %+v, want one of the new stream %s", p, pos, cur.ID)
		}
	}
}

// A position past the end of its own stream (a store restored from an older copy) reads on
// after the stream's end: the event at the end, taken in before, is not sent again, and the
// next one, under a sequence the position had passed, is not skipped.
func TestNotifierPositionAheadOfStream(t *testing.T) {
	t.Parallel()
	e, rc := newSubscribedEnv(t, 1)
	e.publishRev(1, 1)
	cur := e.eventsStream()
	p := partition.Of("s1", testPartitions)
	e.exec(`INSERT INTO notifier_positions (partition, seq, stream) VALUES ($1, 50, $2)`, p, cur.ID)
	e.start()
	testenv.Eventually(t, 10*time.Second, "the position moved back to the stream's end", func() bool {
		return e.positionOf(p) == position{seq: cur.Last, stream: cur.ID}
	})
	e.publishRev(1, 2)
	waitWebhooks(t, rc, 1, 10*time.Second)
	e.waitTakenIn(10 * time.Second)
	checkRevisions(t, rc, 1, 2)
}

// A notifier that kept its position in a file-backed consumer (before notifier_positions)
// resumes after that consumer's ack floor, and its consumer is in memory from then on.
func TestNotifierUpgradeFromFileConsumer(t *testing.T) {
	t.Parallel()
	e, rc := newSubscribedEnv(t, 1)
	e.publishRev(1, 1)
	e.publishRev(1, 2)
	p := partition.Of("s1", testPartitions)
	c, err := e.nats.JS.CreateConsumer(t.Context(), natsx.EventsStream, jetstream.ConsumerConfig{Durable: consumerName(p),
		FilterSubject: natsx.EventsPartitionFilter(p), AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	m, err := c.Next()
	if err != nil {
		t.Fatal(err)
	}
	if err := m.DoubleAck(t.Context()); err != nil {
		t.Fatal(err)
	}
	e.start()
	waitWebhooks(t, rc, 1, 10*time.Second)
	e.waitTakenIn(10 * time.Second)
	checkRevisions(t, rc, 1, 2)
	if c, err := e.nats.JS.Consumer(t.Context(), natsx.EventsStream, consumerName(p)); err != nil || !c.CachedInfo().Config.MemoryStorage {
		t.Fatalf("consumer %s after the upgrade: %v, want it in memory", consumerName(p), err)
	}
}

// Messages that make no transaction (all set aside) still move the position, written on its
// own within positionFlushInterval: a restart does not read a long tail of them again.
func TestNotifierPositionMovesWithoutTransactions(t *testing.T) {
	t.Parallel()
	e, rc := newSubscribedEnv(t, 1)
	e.start()
	e.publishRev(1, 1)
	waitWebhooks(t, rc, 1, 10*time.Second)
	p := partition.Of("s1", testPartitions)
	for i := range 3 {
		if _, err := e.nats.JS.PublishMsg(t.Context(), &nats.Msg{Subject: natsx.EventsSubject(p, "s1"), Data: []byte(fmt.Sprintf("not an event %d", i))}); err != nil {
			t.Fatal(err)
		}
	}
	last := e.eventsStream().Last
	testenv.Eventually(t, 3*positionFlushInterval, "the position past the set-aside messages", func() bool { return e.positionOf(p).seq == last })
}

// SIGKILLed after a run of set-aside messages, before the position after them was written,
// and NATS restarted: the next notifier reads them again, harmlessly (each is recorded once,
// by its record's Nats-Msg-Id), and takes in what follows once.
func TestNotifierCrashAfterSetAsideRun(t *testing.T) {
	t.Parallel()
	e, rc := newSubscribedEnv(t, 1)
	first := e.child("100ms", CrashAfterSetAsideRun)
	e.publishRev(1, 1)
	// Its outcome written too: a crash with an attempt in flight would send it again.
	testenv.Eventually(t, 20*time.Second, "the first event delivered", func() bool {
		var n int
		err := e.pool.QueryRow(t.Context(), `SELECT count(*) FROM notifier_deliveries WHERE state = 'delivered'`).Scan(&n)
		return err == nil && n == 1
	})
	p := partition.Of("s1", testPartitions)
	const bad = 3
	for i := range bad {
		if _, err := e.nats.JS.PublishMsg(t.Context(), &nats.Msg{Subject: natsx.EventsSubject(p, "s1"), Data: []byte(fmt.Sprintf("not an event %d", i))}); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, 15*time.Second, "the child to die at "+CrashAfterSetAsideRun, first.Exited)
	if first.ExitCode() != crashpoint.ExitCode {
		t.Fatalf("child exited with %d, want %d", first.ExitCode(), crashpoint.ExitCode)
	}
	if pos := e.positionOf(p); pos.seq != 1 {
		t.Fatalf("position %d after the crash, want 1 (the set-aside run not written)", pos.seq)
	}
	e.nats.Restart(300 * time.Millisecond)
	e.publishRev(1, 2)

	second := e.child("100ms", "")
	waitWebhooks(t, rc, 2, 30*time.Second)
	e.waitTakenIn(20 * time.Second)
	checkRevisions(t, rc, 1, 1, 2)
	st, err := natsx.Stream(t.Context(), e.nats.JS, natsx.SetAsideStream)
	if err != nil {
		t.Fatal(err)
	}
	if n := st.CachedInfo().State.Msgs; n != bad {
		t.Fatalf("%d set-aside records, want %d (one each)", n, bad)
	}
	second.Stop(t, 20*time.Second)
}
