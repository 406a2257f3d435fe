package logread

import (
	"bytes"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// The tests mostly wait on pulls and timeouts, each on an embedded server of its own.
func TestMain(m *testing.M) { testenv.Main(m, 8) }

// The rebuilds' reader returns every message of its filter once, in order, also when its
// consumer is deleted under it (as the server does to an idle one) and when it starts later.
func TestReaderInOrderThroughLostConsumer(t *testing.T) {
	t.Parallel()
	ns := testenv.NATS(t)
	if err := natsx.Declare(t.Context(), ns.JS, natsx.StreamsConfig{Partitions: 2, LostAfter: time.Hour}); err != nil {
		t.Fatal(err)
	}
	var want []uint64 // sequences of sensor a's partition
	pa := natsx.ReadingsPartitionFilter(0)
	for i := range 300 {
		id := "s" + strconv.Itoa(i%7)
		ack, err := ns.JS.Publish(t.Context(), natsx.ReadingsSubject(id), []byte("{}"))
		if err != nil {
			t.Fatal(err)
		}
		m, err := ns.JS.Stream(t.Context(), natsx.ReadingsStream)
		if err != nil {
			t.Fatal(err)
		}
		raw, err := m.GetMsg(t.Context(), ack.Sequence)
		if err != nil {
			t.Fatal(err)
		}
		if raw.Subject[:len(pa)-1] == pa[:len(pa)-1] {
			want = append(want, ack.Sequence)
		}
	}
	if len(want) < 50 {
		t.Fatalf("%d messages in partition 0: too few to show anything", len(want))
	}
	for _, c := range []struct {
		name  string
		start uint64
		kill  []int // delete the consumer after these many messages
	}{
		{"whole", 0, nil},
		{"consumer deleted twice", 0, []int{10, 11}},
		{"from the middle", want[len(want)/2], []int{5}},
	} {
		r, err := New(t.Context(), ns.JS, natsx.ReadingsStream, pa, c.start)
		if err != nil {
			t.Fatal(err)
		}
		exp := want
		for len(exp) > 0 && exp[0] < c.start {
			exp = exp[1:]
		}
		if r.Pending() != uint64(len(exp)) {
			t.Errorf("%s: pending %d, want %d", c.name, r.Pending(), len(exp))
		}
		var got []uint64
		kill := c.kill
		for len(got) < len(exp) {
			msgs, err := r.Fetch(t.Context(), 7, 0)
			if err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
			if len(msgs) == 0 {
				t.Fatalf("%s: nothing more after %d of %d", c.name, len(got), len(exp))
			}
			for _, m := range msgs {
				md, _ := m.Metadata()
				got = append(got, md.Sequence.Stream)
			}
			if len(kill) > 0 && len(got) >= kill[0] {
				kill = kill[1:]
				if err := ns.JS.DeleteConsumer(t.Context(), natsx.ReadingsStream, r.cons.CachedInfo().Name); err != nil {
					t.Fatal(err)
				}
			}
		}
		for i := range exp {
			if i >= len(got) || got[i] != exp[i] {
				t.Fatalf("%s: read %v, want %v", c.name, got, exp)
			}
		}
		if msgs, err := r.Fetch(t.Context(), 7, 50*time.Millisecond); err != nil || len(msgs) != 0 {
			t.Errorf("%s: after the end: %d messages, %v", c.name, len(msgs), err)
		}
		r.Close(t.Context())
	}
}

// A durable reader hands out a contiguous run only: when a delivery is lost in flight, what
// came after it is discarded and the consumer is recreated right after the last message
// returned, so every message comes once and in order, at once rather than after AckWait; the
// broken run is reported.
func TestDurableReaderRepairsALostDelivery(t *testing.T) {
	t.Parallel()
	ns := oneReadingsPartition(t)
	for i := range 20 {
		publishReading(t, ns, i)
	}
	proxy := testenv.NewNATSProxy(t, ns.URL)
	dropped := proxy.DropNth("$JS.ACK."+natsx.ReadingsStream+".dur.", 5)
	r, gaps := openDurable(t, proxy.URL)
	var got []uint64
	deadline := time.Now().Add(5 * time.Second)
	for len(got) < 20 && time.Now().Before(deadline) {
		msgs, err := r.Fetch(t.Context(), 7, 200*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range msgs {
			md, _ := m.Metadata()
			got = append(got, md.Sequence.Stream)
			_ = m.Ack()
		}
	}
	select {
	case <-dropped:
	default:
		t.Fatal("the proxy lost nothing: the test shows nothing")
	}
	for i, seq := range got {
		if seq != uint64(i+1) {
			t.Fatalf("sequences %v: want 1..20 once each, in order", got)
		}
	}
	if len(got) != 20 || len(*gaps) != 1 {
		t.Fatalf("%d messages (want 20), broken runs reported %q (want one)", len(got), *gaps)
	}
}

// A consumer that stops answering (its leader went down with a NATS node, and the new one is
// not elected yet) is recreated after one idle check, not after the API's 5 s timeout: the
// answer to that check is lost in flight, and the reader reads on within two seconds.
func TestIdleReaderRecreatesAConsumerThatDoesNotAnswer(t *testing.T) {
	t.Parallel()
	ns := oneReadingsPartition(t)
	publishReading(t, ns, 0)
	proxy := testenv.NewNATSProxy(t, ns.URL)
	r, gaps := openDurable(t, proxy.URL)
	msgs, err := r.Fetch(t.Context(), 10, 200*time.Millisecond)
	if err != nil || len(msgs) != 1 {
		t.Fatalf("first fetch: %d messages, %v", len(msgs), err)
	}
	_ = msgs[0].Ack()
	lost := proxy.DropBody(func(_, _ string, body []byte) bool {
		return bytes.Contains(body, []byte(`"type":"io.nats.jetstream.api.v1.consumer_info_response"`))
	})
	start := time.Now()
	msgs, err = r.Fetch(t.Context(), 10, 200*time.Millisecond) // idle: its check goes unanswered
	if err != nil || len(msgs) != 0 {
		t.Fatalf("idle fetch: %d messages, %v; want none and no error", len(msgs), err)
	}
	select {
	case <-lost:
	default:
		t.Fatal("the proxy lost no consumer info answer: the test shows nothing")
	}
	if len(*gaps) != 1 || !strings.Contains((*gaps)[0], "did not answer") {
		t.Fatalf("broken runs reported %q, want one saying the consumer did not answer", *gaps)
	}
	publishReading(t, ns, 1)
	var got []uint64
	for len(got) == 0 && time.Since(start) < 10*time.Second {
		msgs, err := r.Fetch(t.Context(), 10, 200*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range msgs {
			md, _ := m.Metadata()
			got = append(got, md.Sequence.Stream)
		}
	}
	if len(got) != 1 || got[0] != 2 {
		t.Fatalf("after the recreation: sequences %v, want [2]", got)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("reading again took %v after an unanswered check, want within 2 s", took)
	}
}

// A pull that asks not to wait always gets an answer, if only "no messages"; one that gets
// none (the consumer's leader is gone, or the answer was lost) makes the reader read on from
// a new consumer at once.
func TestReaderRecreatesAfterAnUnansweredPull(t *testing.T) {
	t.Parallel()
	ns := oneReadingsPartition(t)
	proxy := testenv.NewNATSProxy(t, ns.URL)
	r, gaps := openDurable(t, proxy.URL)
	lost := proxy.DropBody(func(_, reply string, body []byte) bool {
		return reply == "" && bytes.HasPrefix(body, []byte("NATS/1.0 404"))
	})
	if msgs, err := r.Fetch(t.Context(), 10, 200*time.Millisecond); err != nil || len(msgs) != 0 {
		t.Fatalf("fetch on an empty stream: %d messages, %v", len(msgs), err)
	}
	select {
	case <-lost:
	default:
		t.Fatal("the proxy lost no pull answer: the test shows nothing")
	}
	if len(*gaps) != 1 || !strings.Contains((*gaps)[0], "did not answer a pull") {
		t.Fatalf("broken runs reported %q, want one saying a pull got no answer", *gaps)
	}
	publishReading(t, ns, 1)
	msgs, err := r.Fetch(t.Context(), 10, time.Second)
	if err != nil || len(msgs) != 1 {
		t.Fatalf("after the recreation: %d messages, %v; want the one published", len(msgs), err)
	}
}

// A connection lost while the reader waits for a pull loses nothing when the consumer had
// nothing to deliver: the reader reads on from the same consumer, which needs no meta leader
// (recreating it would), and only recreates it when a delivery went astray.
func TestReaderKeepsItsConsumerAcrossACleanConnectionLoss(t *testing.T) {
	t.Parallel()
	ns := oneReadingsPartition(t)
	proxy := testenv.NewNATSProxy(t, ns.URL)
	r, gaps := openDurable(t, proxy.URL)
	created := r.Consumer().CachedInfo().Created
	var got []uint64
	read := func(wait time.Duration) { got = append(got, fetchAcked(t, r, wait)...) }
	publishReading(t, ns, 0)
	read(200 * time.Millisecond)
	go func() { time.Sleep(300 * time.Millisecond); proxy.Cut() }()
	read(3 * time.Second) // waiting when the connection goes
	// The reader sees the loss before the server may have dropped the lost connection's
	// pull; a reading published in between would go to that pull, truly in flight.
	testenv.Eventually(t, 5*time.Second, "the server to drop the lost connection's pull", func() bool {
		c, err := ns.JS.Consumer(t.Context(), natsx.ReadingsStream, "dur")
		if err != nil {
			return false
		}
		info, err := c.Info(t.Context())
		return err == nil && info.NumWaiting == 0
	})
	publishReading(t, ns, 1)
	for deadline := time.Now().Add(10 * time.Second); len(got) < 2 && time.Now().Before(deadline); {
		read(500 * time.Millisecond)
	}
	if len(got) != 2 || got[0] != 1 || got[1] != 2 {
		t.Fatalf("sequences %v, want [1 2]", got)
	}
	if len(*gaps) != 0 {
		t.Fatalf("broken runs reported %q, want none: nothing was in flight", *gaps)
	}
	info, err := r.Consumer().Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if !info.Created.Equal(created) {
		t.Fatalf("the consumer was recreated (%v, first %v): it needed the meta leader for nothing", info.Created, created)
	}
}

// oneReadingsPartition is a NATS server of the test's own with READINGS in one partition.
func oneReadingsPartition(t *testing.T) *testenv.NATSEnv {
	t.Helper()
	ns := testenv.NATS(t)
	if err := natsx.Declare(t.Context(), ns.JS, natsx.StreamsConfig{Partitions: 1, LostAfter: time.Hour}); err != nil {
		t.Fatal(err)
	}
	return ns
}

// publishReading appends the i-th reading (of sensor s<i>) to READINGS.
func publishReading(t *testing.T, ns *testenv.NATSEnv, i int) {
	t.Helper()
	if _, err := ns.JS.Publish(t.Context(), natsx.ReadingsSubject("s"+strconv.Itoa(i)), []byte("{}")); err != nil {
		t.Fatal(err)
	}
}

// fetchAcked fetches up to 10 messages within wait, acks them and returns their stream
// sequences.
func fetchAcked(t *testing.T, r *Reader, wait time.Duration) []uint64 {
	t.Helper()
	msgs, err := r.Fetch(t.Context(), 10, wait)
	if err != nil {
		t.Fatal(err)
	}
	var seqs []uint64
	for _, m := range msgs {
		md, _ := m.Metadata()
		seqs = append(seqs, md.Sequence.Stream)
		_ = m.Ack()
	}
	return seqs
}

// openDurable opens READINGS' durable reader "dur" through url, and the breaks it reports.
func openDurable(t *testing.T, url string) (*Reader, *[]string) {
	t.Helper()
	gaps := new([]string)
	r, err := Open(t.Context(), testenv.JetStream(t, url, "reader"), Spec{
		Stream: natsx.ReadingsStream, Durable: "dur", AckPolicy: jetstream.AckAllPolicy, AckWait: time.Minute,
		OnGap: func(reason string) { *gaps = append(*gaps, reason) },
	})
	if err != nil {
		t.Fatal(err)
	}
	return r, gaps
}

// A durable whose own group has no leader (its leader died with a NATS node) answers nothing,
// not even its deletion: the reader reads on through an unnamed stand-in at once, in order,
// and goes back to its durable later, when it answers again, leaving no stand-in behind.
func TestReaderReadsThroughAStandInWhileItsDurableDoesNotAnswer(t *testing.T) {
	t.Parallel()
	ns := oneReadingsPartition(t)
	proxy := testenv.NewNATSProxy(t, ns.URL)
	r, gaps := openDurable(t, proxy.URL)
	var got []uint64
	read := func(want int) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); len(got) < want && time.Now().Before(deadline); {
			got = append(got, fetchAcked(t, r, 200*time.Millisecond)...)
		}
	}
	publishReading(t, ns, 0)
	read(1)
	unanswered := proxy.Lose(func(_, _ string, body []byte) bool {
		return bytes.Contains(body, []byte(`"type":"io.nats.jetstream.api.v1.consumer_delete_response"`))
	})
	r.Reopen() // as after a break of the run
	publishReading(t, ns, 1)
	start := time.Now()
	read(2)
	if took := time.Since(start); took > 2500*time.Millisecond {
		t.Fatalf("reading on took %v while the durable did not answer, want within 2.5 s", took)
	}
	if name := r.Consumer().CachedInfo().Name; name == "dur" {
		t.Fatal("still reading the durable: its deletion was answered?")
	}
	if len(*gaps) != 1 || !strings.Contains((*gaps)[0], "stand-in") {
		t.Fatalf("broken runs reported %q, want one saying a stand-in is read", *gaps)
	}
	unanswered()
	r.standInSince = time.Now().Add(-standInFor) // its time on the stand-in is up
	publishReading(t, ns, 2)
	read(3)
	if name := r.Consumer().CachedInfo().Name; name != "dur" {
		t.Fatalf("reading %q, want the durable back", name)
	}
	if len(got) != 3 || got[0] != 1 || got[1] != 2 || got[2] != 3 {
		t.Fatalf("sequences %v, want [1 2 3]", got)
	}
	testenv.Eventually(t, 10*time.Second, "the stand-in to be deleted", func() bool {
		st, err := ns.JS.Stream(t.Context(), natsx.ReadingsStream)
		if err != nil {
			return false
		}
		names := st.ConsumerNames(t.Context())
		var all []string
		for n := range names.Name() {
			all = append(all, n)
		}
		return names.Err() == nil && len(all) == 1 && all[0] == "dur"
	})
}

// A client that reads what the server sends late (a busy machine) loses nothing to a pull
// that runs out as a message is sent: the pull ends with the server's own end-of-pull
// status, which comes after the message, not at a deadline of the client's. Messages are
// published at random moments of the readers' waits; every one comes once, in order, and
// the run never breaks.
func TestReaderLosesNothingToALateClient(t *testing.T) {
	t.Parallel()
	const (
		msgs  = 15
		delay = 100 * time.Millisecond
		wait  = 200 * time.Millisecond
	)
	ns := oneReadingsPartition(t)
	proxy := testenv.NewNATSProxy(t, ns.URL)
	proxy.Delay(delay)
	r, gaps := openDurable(t, proxy.URL)
	rnd := rand.New(rand.NewPCG(29, 1))
	go func() {
		for i := range msgs {
			time.Sleep(150*time.Millisecond + time.Duration(rnd.Int64N(int64(300*time.Millisecond))))
			if _, err := ns.JS.Publish(t.Context(), natsx.ReadingsSubject("s"+strconv.Itoa(i)), []byte("{}")); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	var got []uint64
	for deadline := time.Now().Add(30 * time.Second); len(got) < msgs && time.Now().Before(deadline); {
		got = append(got, fetchAcked(t, r, wait)...)
	}
	for i, seq := range got {
		if seq != uint64(i+1) {
			t.Fatalf("sequences %v: want 1..%d once each, in order", got, msgs)
		}
	}
	if len(got) != msgs || len(*gaps) != 0 {
		t.Fatalf("%d messages (want %d), broken runs reported %q (want none)", len(got), msgs, *gaps)
	}
}
