package history

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/partition"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

func TestStartAt(t *testing.T) {
	t.Parallel()
	s := natsx.Extent{ID: "B", First: 100, Last: 500}
	for _, c := range []struct {
		name  string
		p     position
		s     natsx.Extent
		start uint64
		why   string
	}{
		{"none", position{}, s, 100, ""},
		{"none, new stream", position{}, natsx.Extent{ID: "B"}, 1, ""},
		{"inside", position{"B", 250}, s, 251, ""},
		{"at the end", position{"B", 500}, s, 501, ""},
		{"just before the first", position{"B", 99}, s, 100, ""},
		{"removed by the limits", position{"B", 42}, s, 100, resetTruncated},
		{"ahead of the stream", position{"B", 501}, s, 100, resetAhead},
		{"another stream", position{"A", 250}, s, 100, resetOtherStream},
		{"another stream, new and empty", position{"A", 250}, natsx.Extent{ID: "B"}, 1, resetOtherStream},
	} {
		t.Run(c.name, func(t *testing.T) {
			start, why := startAt(c.p, c.s)
			if start != c.start || why != c.why {
				t.Fatalf("startAt(%+v, %+v) = %d, %q; want %d, %q", c.p, c.s, start, why, c.start, c.why)
			}
		})
	}
}

// historyPositions are the positions of the default consumers of every partition: READINGS'
// and EVENTS', by partition, and DELIVERIES'.
func historyPositions(t testing.TB, e *historyEnv) (readings, events map[int]position, deliveries position) {
	t.Helper()
	names := []string{DurableDefault + "_deliveries"}
	for p := range historyPartitions {
		names = append(names, readingsConsumer(DurableDefault, p), DurableDefault+"_events_"+strconv.Itoa(p))
	}
	ps, err := readPositions(t.Context(), e.ch, names)
	if err != nil {
		t.Fatal(err)
	}
	readings, events = map[int]position{}, map[int]position{}
	for p := range historyPartitions {
		readings[p], events[p] = ps[readingsConsumer(DurableDefault, p)], ps[DurableDefault+"_events_"+strconv.Itoa(p)]
	}
	return readings, events, ps[DurableDefault+"_deliveries"]
}

// historyStream is the identity and extent of stream now.
func historyStream(t testing.TB, e *historyEnv, stream string) natsx.Extent {
	t.Helper()
	st, err := streamNow(t.Context(), e.nats.JS, stream)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// historyLastOf is the stream sequence of the last message under subject (0: none).
func historyLastOf(t testing.TB, e *historyEnv, stream, subject string) uint64 {
	t.Helper()
	st, err := e.nats.JS.Stream(t.Context(), stream)
	if err != nil {
		t.Fatal(err)
	}
	m, err := st.GetLastMsgForSubject(t.Context(), subject)
	if err != nil {
		return 0
	}
	return m.Sequence
}

// historyWaitPositions waits until every READINGS and EVENTS partition's position is its last
// message in the stream as it is now.
func historyWaitPositions(t testing.TB, e *historyEnv) {
	t.Helper()
	rid, eid := historyStream(t, e, natsx.ReadingsStream).ID, historyStream(t, e, natsx.EventsStream).ID
	want := map[string]position{}
	for p := range historyPartitions {
		want["r"+strconv.Itoa(p)] = position{rid, historyLastOf(t, e, natsx.ReadingsStream, natsx.ReadingsPartitionFilter(p))}
		want["e"+strconv.Itoa(p)] = position{eid, historyLastOf(t, e, natsx.EventsStream, natsx.EventsPartitionFilter(p))}
	}
	var got map[string]position
	testenv.Eventually(t, 30*time.Second, "the positions at the partitions' last messages", func() bool {
		r, ev, _ := historyPositions(t, e)
		got = map[string]position{}
		for p := range historyPartitions {
			if w := want["r"+strconv.Itoa(p)]; w.seq > 0 {
				got["r"+strconv.Itoa(p)] = r[p]
			}
			if w := want["e"+strconv.Itoa(p)]; w.seq > 0 {
				got["e"+strconv.Itoa(p)] = ev[p]
			}
		}
		for k, g := range got {
			if g != want[k] {
				return false
			}
		}
		return true
	})
}

func historyPublishEvents(t testing.TB, js jetstream.JetStream, sensor string, from, to int64, base time.Time) {
	t.Helper()
	for rev := from; rev <= to; rev++ {
		ev := event.Event{V: event.Version, ID: event.ID(sensor, rev), Type: event.TypeStateChanged, OccurredAt: base.Add(time.Duration(rev) * time.Minute),
			SensorID: sensor, Data: uint8(rev % 2), Revision: rev, Partition: partition.Of(sensor, historyPartitions), Seq: uint64(rev)}
		b, _ := json.Marshal(ev)
		historyPublishOne(t, js, natsx.EventsSubject(ev.Partition, ev.SensorID), b)
	}
}

func historyPublishAttempts(t testing.TB, js jetstream.JetStream, client string, from, to int, base time.Time) {
	t.Helper()
	for i := from; i < to; i++ {
		a := event.Attempt{V: event.Version, EventID: event.ID("sA", int64(i+1)), ClientID: client, SensorID: "sA", Attempt: 1,
			Time: base.Add(time.Duration(i) * time.Second), StatusCode: 200, LatencyMS: 3, Outcome: event.OutcomeDelivered}
		b, _ := json.Marshal(a)
		historyPublishOne(t, js, natsx.DeliveriesSubject(client), b)
	}
}

// historyPublishOne publishes b, again while NATS is coming back from a restart.
func historyPublishOne(t testing.TB, js jetstream.JetStream, subject string, b []byte) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, err := js.Publish(t.Context(), subject, b)
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("publish to %s: %v", subject, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// historyCount is the number of distinct rows of a history table (by its key).
func historyCount(t testing.TB, e *historyEnv, query string) uint64 {
	t.Helper()
	var n uint64
	if err := e.ch.QueryRow(t.Context(), query).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

const (
	historyEventsQuery     = "SELECT toUInt64(uniqExact(event_id)) FROM events"
	historyDeliveriesQuery = "SELECT toUInt64(uniqExact(event_id, attempt)) FROM deliveries"
)

// The consumers live in memory (no state file in the NATS store), and the positions in
// ClickHouse follow what is written: each partition's is its last message, which the
// projection's listing shows as its checkpoint with no lag.
func TestHistoryConsumersInMemory(t *testing.T) {
	t.Parallel()
	e := newHistoryEnv(t)
	base := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	logs := historyReadings(40, 4000, base, 0)
	historyPublish(t, e.nats.JS, logs)
	historyPublishEvents(t, e.nats.JS, "sA", 1, 10, base)
	historyPublishAttempts(t, e.nats.JS, "c1", 0, 10, base)
	_, stop := runHistory(t, historyTestConfig(), e.nats.JS, e.ch)
	defer stop()
	historyWaitRows(t, e.ch, 4000, 30*time.Second)
	testenv.Eventually(t, 20*time.Second, "10 events and 10 deliveries", func() bool {
		return historyCount(t, e, historyEventsQuery) == 10 && historyCount(t, e, historyDeliveriesQuery) == 10
	})
	// A second round of deliveries: DELIVERIES' position is its ack floor as of the batch
	// before, so it shows once a batch follows the first.
	historyPublishAttempts(t, e.nats.JS, "c1", 10, 20, base)
	testenv.Eventually(t, 20*time.Second, "20 deliveries and DELIVERIES' position", func() bool {
		_, _, d := historyPositions(t, e)
		return historyCount(t, e, historyDeliveriesQuery) == 20 && d.seq >= 10
	})
	historyWaitPositions(t, e)
	if _, _, d := historyPositions(t, e); d.stream != historyStream(t, e, natsx.DeliveriesStream).ID || d.seq > 20 {
		t.Errorf("DELIVERIES position %+v: want 10 to 20 on the current stream", d)
	}

	names := map[string][]string{natsx.DeliveriesStream: {DurableDefault + "_deliveries"}}
	for p := range historyPartitions {
		names[natsx.ReadingsStream] = append(names[natsx.ReadingsStream], readingsConsumer(DurableDefault, p))
		names[natsx.EventsStream] = append(names[natsx.EventsStream], DurableDefault+"_events_"+strconv.Itoa(p))
	}
	storeDir := e.nats.Server.JetStreamConfig().StoreDir
	for stream, ns := range names {
		for _, n := range ns {
			c, err := e.nats.JS.Consumer(t.Context(), stream, n)
			if err != nil {
				t.Fatalf("%s on %s: %v", n, stream, err)
			}
			if !c.CachedInfo().Config.MemoryStorage {
				t.Errorf("%s on %s is file-backed", n, stream)
			}
		}
		// A file-backed consumer keeps its state under the stream's obs directory.
		dir := filepath.Join(storeDir, "$G", "streams", stream)
		if _, err := os.Stat(dir); err != nil {
			t.Fatalf("the stream's directory in the NATS store: %v", err)
		}
		obs, _ := os.ReadDir(filepath.Join(dir, "obs"))
		for _, o := range obs {
			if strings.HasPrefix(o.Name(), DurableDefault+"_") {
				t.Errorf("%s has a consumer state directory in the NATS store: %s", stream, o.Name())
			}
		}
	}

	st, err := e.nats.JS.Stream(t.Context(), natsx.ReadingsStream)
	if err != nil {
		t.Fatal(err)
	}
	infos, err := infos(t.Context(), e.ch, st, historyPartitions)
	if err != nil {
		t.Fatal(err)
	}
	readings, _, _ := historyPositions(t, e)
	for _, p := range infos[0].Partitions {
		if p.Checkpoint != readings[p.Partition].seq || p.Checkpoint != p.LastSeq || p.Lag != 0 {
			t.Errorf("listing of partition %d: %+v, want the position %d as checkpoint, the last sequence, no lag", p.Partition, p, readings[p.Partition].seq)
		}
	}
}

// A consumer starts right after its position in ClickHouse, not where its JetStream state
// would have it (a new consumer: the stream's start); a position that does not belong to
// the stream as it is now starts at the stream's first message, counted by reason.
func TestHistoryResumesAtPosition(t *testing.T) {
	t.Parallel()
	const total, mid = 4000, 2000 // stream sequences; the readings' positions are planted at mid
	for _, c := range []struct {
		name string
		// plant is the READINGS position of every partition, given the stream's identity
		// and last sequence.
		plant func(id string, last uint64) position
		purge uint64 // messages before it are removed from READINGS before the start
		from  uint64 // the first stream sequence written
		why   string
	}{
		{"after the position", func(id string, _ uint64) position { return position{id, mid} }, 0, mid + 1, ""},
		{"another stream", func(string, uint64) position { return position{"2001-01-01T00:00:00Z", mid} }, 0, 1, resetOtherStream},
		{"ahead of the stream", func(id string, last uint64) position { return position{id, last + 100} }, 0, 1, resetAhead},
		{"before the stream's first", func(id string, _ uint64) position { return position{id, 10} }, mid, mid, resetTruncated},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := newHistoryEnv(t)
			logs := historyReadings(40, total, time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC), 0)
			historyPublish(t, e.nats.JS, logs)
			st := historyStream(t, e, natsx.ReadingsStream)
			if c.purge > 0 {
				s, err := e.nats.JS.Stream(t.Context(), natsx.ReadingsStream)
				if err != nil {
					t.Fatal(err)
				}
				if err := s.Purge(t.Context(), jetstream.WithPurgeSequence(c.purge)); err != nil {
					t.Fatal(err)
				}
			}
			ps := map[string]position{}
			for p := range historyPartitions {
				ps[readingsConsumer(DurableDefault, p)] = c.plant(st.ID, st.Last)
			}
			if err := writePositions(t.Context(), e.ch, ps, time.Now()); err != nil {
				t.Fatal(err)
			}
			var want []event.Log // the readings at or after from (stream sequence i+1 is logs[i])
			for i, l := range logs {
				if uint64(i+1) >= c.from && l.Kind == event.KindReading {
					want = append(want, l)
				}
			}
			h, stop := runHistory(t, historyTestConfig(), e.nats.JS, e.ch)
			historyWaitPositions(t, e)
			stop()
			if n := historyCounter(h.m.rows.WithLabelValues("readings")); n != float64(len(want)) {
				t.Errorf("%v rows written, want %d", n, len(want))
			}
			var first uint64
			if err := e.ch.QueryRow(t.Context(), "SELECT min(seq) FROM readings").Scan(&first); err != nil {
				t.Fatal(err)
			}
			if d, _ := historyDistinct(t, e.ch); d != uint64(len(want)) || first < c.from {
				t.Errorf("%d distinct readings from sequence %d, want %d from %d", d, first, len(want), c.from)
			}
			historyCheckExactlyOnce(t, e.ch, want, 1000)
			for _, why := range []string{resetOtherStream, resetAhead, resetTruncated} {
				n, w := historyCounter(h.m.resets.WithLabelValues("readings", why)), 0.0
				if why == c.why {
					w = historyPartitions
				}
				if n != w {
					t.Errorf("%v resets %s, want %v", n, why, w)
				}
			}
		})
	}
}

// Killed between a batch's positions and its acks, on a NATS that outlives the process (its
// memory consumers hold the batch unacked): the next process starts after the positions,
// so nothing of the batch is written again and nothing after it is missed.
func TestHistoryCrashAfterPosition(t *testing.T) {
	t.Parallel()
	e := newHistoryEnv(t)
	const total = 60_000
	logs := historyReadings(200, total, time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC), 0)
	historyPublish(t, e.nats.JS, logs)
	historyChild(t, e, CrashAfterPosition+":3")
	before, _ := historyDistinct(t, e.ch)
	if before == 0 || before >= total {
		t.Fatalf("%d readings written before the kill: it was not in the middle", before)
	}
	h, stop := runHistory(t, historyTestConfig(), e.nats.JS, e.ch)
	historyWaitRows(t, e.ch, total, 60*time.Second)
	historyWaitPositions(t, e)
	stop()
	if n := historyCounter(h.m.rows.WithLabelValues("readings")); n != float64(total-before) {
		t.Errorf("after the kill with %d readings written: %v rows written, want %d", before, n, total-before)
	}
	historyCheckExactlyOnce(t, e.ch, logs, 1000)
}

// Stopped, NATS restarted (the memory consumers are gone), started again: every consumer
// resumes from its position in ClickHouse, so the second run writes only what came since.
func TestHistoryRestartsFromPositions(t *testing.T) {
	t.Parallel()
	e := newHistoryEnv(t)
	base := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	logs := historyReadings(40, 8000, base, 0)
	historyPublish(t, e.nats.JS, logs[:4000])
	historyPublishEvents(t, e.nats.JS, "sA", 1, 10, base)
	historyPublishAttempts(t, e.nats.JS, "c1", 0, 10, base)
	first, second := historyCountReadings(logs[:4000]), historyCountReadings(logs[4000:])
	_, stop := runHistory(t, historyTestConfig(), e.nats.JS, e.ch)
	testenv.Eventually(t, 30*time.Second, "the first run's rows", func() bool {
		d, _ := historyDistinct(t, e.ch)
		return d == first && historyCount(t, e, historyEventsQuery) == 10 && historyCount(t, e, historyDeliveriesQuery) == 10
	})
	historyWaitPositions(t, e)
	stop()

	e.nats.Restart(time.Second)
	historyPublish(t, e.nats.JS, logs[4000:])
	historyPublishEvents(t, e.nats.JS, "sA", 11, 15, base)
	historyPublishAttempts(t, e.nats.JS, "c1", 10, 15, base)
	h, stop := runHistory(t, historyTestConfig(), e.nats.JS, e.ch)
	testenv.Eventually(t, 30*time.Second, "the second run's rows", func() bool {
		d, _ := historyDistinct(t, e.ch)
		return d == first+second && historyCount(t, e, historyEventsQuery) == 15 && historyCount(t, e, historyDeliveriesQuery) == 15
	})
	historyWaitPositions(t, e)
	stop()
	if r, ev := historyCounter(h.m.rows.WithLabelValues("readings")), historyCounter(h.m.rows.WithLabelValues("events")); r != float64(second) || ev != 5 {
		t.Errorf("the second run wrote %v readings and %v events, want %d and 5: only what came since", r, ev, second)
	}
	historyCheckExactlyOnce(t, e.ch, logs, 1000)
}

// NATS restarted while the projector runs: the memory consumers are gone, and each one,
// the shared DELIVERIES consumer too, is made again where it stood.
func TestHistoryDeliveriesAcrossNATSRestart(t *testing.T) {
	t.Parallel()
	e := newHistoryEnv(t)
	base := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	historyPublishEvents(t, e.nats.JS, "sA", 1, 20, base)
	historyPublishAttempts(t, e.nats.JS, "c1", 0, 50, base)
	_, stop := runHistory(t, historyTestConfig(), e.nats.JS, e.ch)
	defer stop()
	testenv.Eventually(t, 20*time.Second, "20 events and 50 deliveries", func() bool {
		return historyCount(t, e, historyEventsQuery) == 20 && historyCount(t, e, historyDeliveriesQuery) == 50
	})
	historyPublishAttempts(t, e.nats.JS, "c1", 50, 100, base)
	testenv.Eventually(t, 20*time.Second, "100 deliveries", func() bool { return historyCount(t, e, historyDeliveriesQuery) == 100 })

	e.nats.Restart(time.Second)
	historyPublishEvents(t, e.nats.JS, "sA", 21, 30, base)
	historyPublishAttempts(t, e.nats.JS, "c1", 100, 150, base)
	testenv.Eventually(t, 40*time.Second, "30 events and 150 deliveries after the restart", func() bool {
		return historyCount(t, e, historyEventsQuery) == 30 && historyCount(t, e, historyDeliveriesQuery) == 150
	})
	c, err := e.nats.JS.Consumer(t.Context(), natsx.DeliveriesStream, DurableDefault+"_deliveries")
	if err != nil || !c.CachedInfo().Config.MemoryStorage {
		t.Fatalf("DELIVERIES consumer after the restart: %v (in memory: %v)", err, err == nil && c.CachedInfo().Config.MemoryStorage)
	}
}

func historyCountReadings(logs []event.Log) uint64 {
	var n uint64
	for _, l := range logs {
		if l.Kind == event.KindReading {
			n++
		}
	}
	return n
}

// Upgraded from a version that kept no positions: each consumer starts after the ack floor
// of the file-backed durable it replaces, not at the stream's start, and is in memory after.
func TestHistoryTakesOverFileConsumers(t *testing.T) {
	t.Parallel()
	e := newHistoryEnv(t)
	base := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	logs := historyReadings(40, 4000, base, 0)
	historyPublish(t, e.nats.JS, logs)
	historyPublishAttempts(t, e.nats.JS, "c1", 0, 30, base)
	// The old durables, file-backed, each having acked its first messages up to the middle.
	const acked = 2000
	durables := map[string]string{DurableDefault + "_deliveries": natsx.DeliveriesStream}
	for p := range historyPartitions {
		durables[readingsConsumer(DurableDefault, p)] = natsx.ReadingsStream + "/" + natsx.ReadingsPartitionFilter(p)
	}
	for name, where := range durables {
		stream, filter, _ := strings.Cut(where, "/")
		c, err := e.nats.JS.CreateConsumer(t.Context(), stream, jetstream.ConsumerConfig{Durable: name, FilterSubject: filter,
			AckPolicy: jetstream.AckExplicitPolicy, DeliverPolicy: jetstream.DeliverAllPolicy})
		if err != nil {
			t.Fatal(err)
		}
		n := acked / historyPartitions
		if stream == natsx.DeliveriesStream {
			n = 10
		}
		b, err := c.Fetch(n, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for m := range b.Messages() {
			if err := m.DoubleAck(t.Context()); err != nil {
				t.Fatal(err)
			}
		}
	}
	var want []event.Log // after each partition's ack floor
	floors := map[string]uint64{}
	for name := range durables {
		c, err := e.nats.JS.Consumer(t.Context(), strings.Split(durables[name], "/")[0], name)
		if err != nil {
			t.Fatal(err)
		}
		floors[name] = c.CachedInfo().AckFloor.Stream
	}
	for i, l := range logs {
		if l.Kind == event.KindReading && uint64(i+1) > floors[readingsConsumer(DurableDefault, partition.Of(l.SensorID, historyPartitions))] {
			want = append(want, l)
		}
	}
	h, stop := runHistory(t, historyTestConfig(), e.nats.JS, e.ch)
	historyWaitPositions(t, e)
	testenv.Eventually(t, 20*time.Second, "the 20 deliveries after the ack floor", func() bool { return historyCount(t, e, historyDeliveriesQuery) == 20 })
	// Each consumer in memory, looked at while the projector runs: on a loaded machine a
	// consumer whose pull went unanswered is deleted and made again, and a stop in between
	// leaves it to the next start.
	testenv.Eventually(t, 20*time.Second, "every consumer, in memory", func() bool {
		for name, where := range durables {
			c, err := e.nats.JS.Consumer(t.Context(), strings.Split(where, "/")[0], name)
			if err != nil || !c.CachedInfo().Config.MemoryStorage {
				return false
			}
		}
		return true
	})
	stop()
	if n := historyCounter(h.m.rows.WithLabelValues("readings")); n != float64(len(want)) {
		t.Errorf("%v readings written, want the %d after the ack floors", n, len(want))
	}
	if n := historyCount(t, e, historyDeliveriesQuery); n != 20 {
		t.Errorf("%d deliveries written, want the 20 after the ack floor", n)
	}
	historyCheckExactlyOnce(t, e.ch, want, 1000)
}
