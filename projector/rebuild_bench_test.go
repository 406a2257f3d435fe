package projector

import (
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/lock-sensors/lock-sensors/internal/partition"
)

// BenchmarkStateRebuild times the rebuild of the state projection beside the live projector
// on the same log: 1,000,000 readings over 100,000 sensors in 16 partitions (change them with
// LOCKS_BENCH_REBUILD_READINGS and LOCKS_BENCH_REBUILD_SENSORS; LOCKS_BENCH_REBUILD_BATCH sets
// the rebuild's batch size). The live projector applies the log first (its rate is reported
// as live-readings/s), is stopped, and the rebuild then applies it again into the shadow,
// checks every event against EVENTS and swaps (rebuild-readings/s).
func BenchmarkStateRebuild(b *testing.B) {
	readings := stateBenchInt("LOCKS_BENCH_REBUILD_READINGS", 1_000_000)
	sensors := stateBenchInt("LOCKS_BENCH_REBUILD_SENSORS", 100_000)
	for range b.N {
		b.StopTimer()
		e := newStateEnv(b, 16)
		r := rand.New(rand.NewPCG(11, 12))
		logs := stateRandomReadings(r, stateSensorIDs(r, sensors), readings, 0.8, stateT0)
		var pub statePublished
		e.publish(b, e.nats.JS, logs, &pub)
		logs, pub.logs = nil, nil
		runtime.GC()

		start := time.Now()
		stop := e.runState(b, e.nats.JS, partition.All(e.n))
		for !e.checkpointsAt(b, &pub) {
			time.Sleep(20 * time.Millisecond)
		}
		live := time.Since(start)
		e.waitCaughtUp(b, &pub, 10*time.Minute)
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
