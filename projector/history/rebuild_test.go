package history

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/partition"
	"github.com/lock-sensors/lock-sensors/internal/rebuild"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// historyDigest is the distinct rows of a history table as a count and a sum of row hashes.
func historyDigest(t testing.TB, ch driver.Conn, tb table, table string) (n, sum uint64) {
	t.Helper()
	cols := tb.schema.List()
	var hs []string
	for _, c := range strings.Split(cols, ",") {
		hs = append(hs, "ifNull(toString("+strings.TrimSpace(c)+"), 'NULL')")
	}
	q := "SELECT toUInt64(count()), toUInt64(sum(cityHash64(" + strings.Join(hs, ", ") + "))) FROM (SELECT DISTINCT " + cols + " FROM " + table + ")"
	if err := ch.QueryRow(t.Context(), q).Scan(&n, &sum); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n, sum
}

func TestHistoryRebuild(t *testing.T) {
	t.Parallel()
	e := newHistoryEnv(t)
	base := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	logs := historyReadings(50, 9000, base, 0)
	first := 6000 + 6000/1000 // readings and the liveness facts among them
	historyPublish(t, e.nats.JS, logs[:first])
	for rev := int64(1); rev <= 20; rev++ {
		ev := event.Event{V: event.Version, ID: event.ID("sA", rev), Type: event.TypeStateChanged, OccurredAt: base.Add(time.Duration(rev) * time.Minute),
			SensorID: "sA", Data: uint8(rev % 2), Revision: rev, Partition: partition.Of("sA", historyPartitions), Seq: uint64(rev)}
		b, _ := json.Marshal(ev)
		if _, err := e.nats.JS.Publish(t.Context(), natsx.EventsSubject(ev.Partition, ev.SensorID), b); err != nil {
			t.Fatal(err)
		}
		a := event.Attempt{V: event.Version, EventID: ev.ID, ClientID: "c1", SensorID: "sA", Attempt: 1, Time: ev.OccurredAt,
			StatusCode: 200, LatencyMS: 3, Outcome: event.OutcomeDelivered}
		b, _ = json.Marshal(a)
		if _, err := e.nats.JS.Publish(t.Context(), natsx.DeliveriesSubject(a.ClientID), b); err != nil {
			t.Fatal(err)
		}
	}
	_, stop := runHistory(t, historyTestConfig(), e.nats.JS, e.ch)
	historyWaitRows(t, e.ch, 6000, 60*time.Second)
	testenv.Eventually(t, 30*time.Second, "the live history's 20 events and 20 deliveries", func() bool {
		ne, _ := historyDigest(t, e.ch, tables[1], "events")
		nd, _ := historyDigest(t, e.ch, tables[2], "deliveries")
		return ne == 20 && nd == 20
	})

	// The rest is ingested while the rebuild runs.
	var sent atomic.Int64
	ingested := make(chan struct{})
	go func() {
		defer close(ingested)
		for i := first; i < len(logs); i += 300 {
			historyPublish(t, e.nats.JS, logs[i:min(i+300, len(logs))])
			sent.Add(1)
			time.Sleep(20 * time.Millisecond)
		}
	}()
	r, err := NewRebuild(RebuildConfig{PartitionCount: historyPartitions, BatchSize: 1000}, RebuildDeps{JS: e.nats.JS, CH: e.ch, Logger: testenv.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	res, err := r.Run(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("rebuild %+v; %d publish rounds before it ended", res, sent.Load())
	<-ingested
	if sent.Load() == 0 {
		t.Error("nothing was ingested during the rebuild: the test shows nothing")
	}
	for _, tb := range tables[1:] {
		n1, s1 := historyDigest(t, e.ch, tb, tb.name)
		n0, s0 := historyDigest(t, e.ch, tb, tb.name+res.OldTable)
		if n1 != 20 || n1 != n0 || s1 != s0 {
			t.Errorf("%s: rebuilt %d rows (digest %d), live before %d (digest %d), want 20 equal", tb.name, n1, s1, n0, s0)
		}
	}
	// Every reading, before, during and after the rebuild, exactly once in the new table.
	historyWaitRows(t, e.ch, 9000, 60*time.Second)
	historyCheckExactlyOnce(t, e.ch, logs, 1000)
	// The positions are the live projector's, which no swap touches: at the partitions' ends.
	historyWaitPositions(t, e)
	stop()

	dropped, err := DropOld(t.Context(), e.ch)
	if err != nil {
		t.Fatal(err)
	}
	if len(dropped) != 3 || !strings.HasSuffix(dropped[0], res.OldTable) {
		t.Errorf("dropped %v, want the three *%s tables", dropped, res.OldTable)
	}
	historyWaitPositions(t, e)
}

func TestHistoryRebuildRefusesTruncatedLog(t *testing.T) {
	t.Parallel()
	e := newHistoryEnv(t)
	historyPublish(t, e.nats.JS, historyReadings(5, 200, time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC), 0))
	st, err := e.nats.JS.Stream(t.Context(), natsx.ReadingsStream)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Purge(t.Context(), jetstream.WithPurgeSequence(50)); err != nil {
		t.Fatal(err)
	}
	r, err := NewRebuild(RebuildConfig{PartitionCount: historyPartitions}, RebuildDeps{JS: e.nats.JS, CH: e.ch, Logger: testenv.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if _, err := r.Run(ctx); !errors.Is(err, rebuild.ErrLogTruncated) {
		t.Fatalf("history rebuild of a truncated READINGS: %v, want rebuild.ErrLogTruncated", err)
	}
}

// A history rebuild stopped halfway starts its shadows over on the next run and ends with
// every reading exactly once.
func TestHistoryRebuildStoppedAndRunAgain(t *testing.T) {
	t.Parallel()
	e := newHistoryEnv(t)
	logs := historyReadings(20, 6000, time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC), 0)
	historyPublish(t, e.nats.JS, logs)
	_, stop := runHistory(t, historyTestConfig(), e.nats.JS, e.ch)
	historyWaitRows(t, e.ch, 6000, 60*time.Second)

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var stoppedAt atomic.Uint64
	r, err := NewRebuild(RebuildConfig{PartitionCount: historyPartitions, BatchSize: 100, ProgressEvery: time.Millisecond, Progress: func(p rebuild.Progress) {
		if p.Done > 0 && stoppedAt.CompareAndSwap(0, p.Done) {
			cancel()
		}
	}}, RebuildDeps{JS: e.nats.JS, CH: e.ch, Logger: testenv.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Run(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("stopped history rebuild: %v, want context.Canceled (stopped after %d messages)", err, stoppedAt.Load())
	}
	r, err = NewRebuild(RebuildConfig{PartitionCount: historyPartitions}, RebuildDeps{JS: e.nats.JS, CH: e.ch, Logger: testenv.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	res, err := r.Run(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("stopped after %d messages; second run %+v", stoppedAt.Load(), res)
	historyWaitRows(t, e.ch, 6000, 30*time.Second)
	historyCheckExactlyOnce(t, e.ch, logs, 1000)
	stop()
}
