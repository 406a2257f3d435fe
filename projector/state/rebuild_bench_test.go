package state

import (
	"errors"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/partition"
)

// BenchmarkStateRebuild times the rebuild of the state projection beside the live projector
// on the same log: 10,000,000 readings over 100,000 sensors in 16 partitions (change them with
// LOCKS_BENCH_REBUILD_READINGS, e.g. 1000000 for the former quick run, and
// LOCKS_BENCH_REBUILD_SENSORS; LOCKS_BENCH_REBUILD_BATCH sets the rebuild's batch size). The
// log is generated and published in chunks (async, a large pending window, no message ids),
// so it is never held in memory. The live projector applies the log first (its rate is
// reported as live-readings/s), is stopped, and the rebuild then applies it again into the
// shadow, checks every event against EVENTS and swaps (rebuild-readings/s).
func BenchmarkStateRebuild(b *testing.B) {
	readings := stateBenchInt("LOCKS_BENCH_REBUILD_READINGS", 10_000_000)
	sensors := stateBenchInt("LOCKS_BENCH_REBUILD_SENSORS", 100_000)
	for range b.N {
		b.StopTimer()
		e := newStateEnv(b, 16)
		r := rand.New(rand.NewPCG(11, 12))
		var pub statePublished
		pubStart := time.Now()
		rebuildPublishFast(b, e.nats.NC, e.n, rebuildReadingsGen(r, stateSensorIDs(r, sensors), readings, 0.8, stateT0), &pub)
		b.Logf("published %d readings in %s", readings, time.Since(pubStart).Round(time.Millisecond))

		start := time.Now()
		stop := e.runState(b, e.nats.JS, partition.All(e.n))
		for !e.checkpointsAt(b, &pub) {
			time.Sleep(20 * time.Millisecond)
		}
		live := time.Since(start)
		e.waitCaughtUp(b, &pub, 60*time.Minute)
		stop()

		b.StartTimer()
		res, err := e.newRebuild(b, RebuildConfig{BatchSize: stateBenchInt("LOCKS_BENCH_REBUILD_BATCH", 0)}).Run(b.Context())
		b.StopTimer()
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(readings)/live.Seconds(), "live-readings/s")
		b.ReportMetric(float64(res.Applied)/res.Elapsed.Seconds(), "rebuild-readings/s")
		b.Logf("live projector: %d readings in %s; rebuild: %d readings, %d events checked, in %s",
			readings, live.Round(time.Millisecond), res.Applied, res.EventsChecked, res.Elapsed.Round(time.Millisecond))
	}
}

// rebuildReadingsGen yields what stateRandomReadings would make, one reading at a time.
func rebuildReadingsGen(r *rand.Rand, ids []string, count int, repeat float64, start time.Time) func() (event.Log, bool) {
	last := map[string]uint8{}
	i := 0
	return func() (event.Log, bool) {
		if i >= count {
			return event.Log{}, false
		}
		id := ids[r.IntN(len(ids))]
		d, ok := last[id]
		if !ok || r.Float64() >= repeat {
			d = uint8(r.IntN(2))
		}
		last[id] = d
		recv := start.Add(time.Duration(i) * time.Millisecond)
		i++
		return event.Log{V: event.Version, Kind: event.KindReading, SensorID: id, Data: d,
			Time: recv.Add(-time.Duration(r.IntN(1000)) * time.Microsecond), ReceivedTime: recv,
			MessageID: "m" + strconv.FormatInt(recv.UnixNano(), 36)}, true
	}
}

// rebuildSliceGen yields logs in order.
func rebuildSliceGen(logs []event.Log) func() (event.Log, bool) {
	i := 0
	return func() (event.Log, bool) {
		if i >= len(logs) {
			return event.Log{}, false
		}
		i++
		return logs[i-1], true
	}
}

// rebuildPublishFast appends what next yields to READINGS with async publishes in a large
// window and no message ids (nothing for the stream to de-duplicate), and records each
// partition's last sequence in into.
func rebuildPublishFast(t testing.TB, nc *nats.Conn, n int, next func() (event.Log, bool), into *statePublished) {
	t.Helper()
	const window = 50_000
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(window))
	if err != nil {
		t.Fatal(err)
	}
	if into.maxSeq == nil {
		into.maxSeq = map[int]uint64{}
	}
	futs := make([]jetstream.PubAckFuture, 0, window)
	parts := make([]int, 0, window)
	for done := false; !done; {
		futs, parts = futs[:0], parts[:0]
		for len(futs) < window {
			l, ok := next()
			if !ok {
				done = true
				break
			}
			f, err := js.PublishMsgAsync(&nats.Msg{Subject: natsx.ReadingsSubject(l.SensorID), Data: stateJSON(t, l)})
			if err != nil {
				t.Fatalf("publish: %v", err)
			}
			futs = append(futs, f)
			parts = append(parts, partition.Of(l.SensorID, n))
		}
		for i, f := range futs {
			var a *jetstream.PubAck
			select {
			case a = <-f.Ok():
			case err := <-f.Err():
				t.Fatalf("publish ack: %v", err)
			case <-time.After(60 * time.Second):
				t.Fatal(errors.New("no publish ack within 60s"))
			}
			into.maxSeq[parts[i]] = max(into.maxSeq[parts[i]], a.Sequence)
		}
	}
}
