package watchdog

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/partition"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

func benchSize(def int) int {
	if v, err := strconv.Atoi(os.Getenv("LOCKS_BENCH_SENSORS")); err == nil && v > 0 {
		return v
	}
	return def
}

func sensorName(i int) string { return "s" + strconv.Itoa(i) }

// appendReadings writes one reading per sensor straight to READINGS, as fast as JetStream
// takes them, and returns each one's receive time.
func appendReadings(b *testing.B, js jetstream.JetStream, n int) []time.Time {
	return appendReadingsOver(b, js, n, 0)
}

// appendReadingsOver spreads the appends evenly over d (0: as fast as possible).
func appendReadingsOver(b *testing.B, js jetstream.JetStream, n int, d time.Duration) []time.Time {
	b.Helper()
	at := make([]time.Time, n)
	begin := time.Now()
	for i := 0; i < n; i++ {
		if d > 0 && i%100 == 0 {
			if ahead := time.Until(begin.Add(d * time.Duration(i) / time.Duration(n))); ahead > 0 {
				time.Sleep(ahead)
			}
		}
		s := sensorName(i)
		now := time.Now().UTC()
		at[i] = now
		body, _ := json.Marshal(event.Log{V: event.Version, Kind: event.KindReading, SensorID: s, Data: 1, Time: now, ReceivedTime: now, MessageID: s})
		for {
			if _, err := js.PublishMsgAsync(&nats.Msg{Subject: natsx.ReadingsSubject(s), Data: body}); err == nil {
				break
			}
			time.Sleep(time.Millisecond)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(5 * time.Minute):
		b.Fatal("appends not acknowledged within 5 minutes")
	}
	return at
}

func memFigures() (heapMB, rssMB float64) {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	heapMB = float64(ms.HeapInuse) / (1 << 20)
	if b, err := os.ReadFile("/proc/self/status"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "VmRSS:") {
				var kb float64
				fmt.Sscan(strings.TrimSpace(strings.TrimSuffix(strings.TrimPrefix(l, "VmRSS:"), "kB")), &kb)
				rssMB = kb / 1024
			}
		}
	}
	return heapMB, rssMB
}

// BenchmarkTrack measures the refresh rate the watchdog sustains while it applies a READINGS
// backlog of one reading per sensor (LOCKS_BENCH_SENSORS, default 1,000,000) to the keys, and
// the memory of the process (embedded NATS included) once every sensor is tracked, and
// before the watchdog started.
func BenchmarkTrack(b *testing.B) {
	n := benchSize(1_000_000)
	for b.Loop() {
		e := newEnv(b, time.Hour)
		appendStart := time.Now()
		appendReadings(b, e.nats.JS, n)
		b.Logf("appended %d readings in %s", n, time.Since(appendStart).Round(time.Millisecond))
		heap0, rss0 := memFigures()
		_, reg, stop := e.start(Config{PartitionCount: testPartitions, LostAfter: time.Hour})
		start := time.Now()
		for counter(b, reg, "locks_watchdog_refreshes_total") < float64(n) {
			if time.Since(start) > 10*time.Minute {
				b.Fatalf("only %v of %d keys refreshed in 10 minutes", counter(b, reg, "locks_watchdog_refreshes_total"), n)
			}
			time.Sleep(50 * time.Millisecond)
		}
		elapsed := time.Since(start)
		heap1, rss1 := memFigures()
		if path := os.Getenv("LOCKS_BENCH_HEAPPROFILE"); path != "" {
			if out, err := os.Create(path); err == nil {
				_ = pprof.WriteHeapProfile(out)
				_ = out.Close()
			}
		}
		kvs, err := e.nats.JS.Stream(context.Background(), kvStream)
		if err != nil {
			b.Fatal(err)
		}
		st := kvs.CachedInfo().State
		b.ReportMetric(float64(n)/elapsed.Seconds(), "kv-updates/s")
		b.ReportMetric(float64(n), "sensors")
		b.ReportMetric(heap1, "heap-MB")
		b.ReportMetric(rss1, "rss-MB")
		// The process before the watchdog started (embedded NATS holding the backlog): what
		// the watchdog adds is the difference.
		b.ReportMetric(heap0, "heap-before-MB")
		b.ReportMetric(rss0, "rss-before-MB")
		b.Logf("%d sensors tracked: %d KV updates in %s = %.0f/s; heap %.0f MB (%.0f before the watchdog), RSS %.0f MB (%.0f before); KV stream %d msgs %d MB",
			n, n, elapsed.Round(time.Millisecond), float64(n)/elapsed.Seconds(), heap1, heap0, rss1, rss0, st.Msgs, st.Bytes>>20)
		// Held, not just taken in: the server keeps each block's per-subject state for 2
		// minutes and its cache for 10 s after the block was last used (filestore's
		// defaultFssExpiration, defaultCacheBufferExpiration), so the figures right after the
		// backlog include what the burst itself costs. LOCKS_BENCH_SETTLE (e.g. 150s) waits
		// that long with every key live and measures again.
		if settle, err := time.ParseDuration(os.Getenv("LOCKS_BENCH_SETTLE")); err == nil && settle > 0 {
			time.Sleep(settle)
			heap2, rss2 := memFigures()
			b.ReportMetric(heap2, "heap-settled-MB")
			b.ReportMetric(rss2, "rss-settled-MB")
			b.Logf("after %s with every key live: heap %.0f MB, RSS %.0f MB", settle, heap2, rss2)
			if path := os.Getenv("LOCKS_BENCH_HEAPPROFILE"); path != "" {
				if out, err := os.Create(path + ".settled"); err == nil {
					_ = pprof.WriteHeapProfile(out)
					_ = out.Close()
				}
			}
		}
		stop()
	}
}

// BenchmarkExpiryDelay lets LOCKS_BENCH_SENSORS (default 100,000) sensors expire within the
// same minute and measures the delay from each deadline (last reading + lost_after) to its
// liveness_timeout fact in READINGS: "burst" has every deadline within a few seconds (as
// fast as the readings can be appended), "spread" spreads them over 50 s.
func BenchmarkExpiryDelay(b *testing.B) {
	for _, c := range []struct {
		name   string
		spread time.Duration
	}{{"burst", 0}, {"spread50s", 50 * time.Second}} {
		b.Run(c.name, func(b *testing.B) { benchExpiryDelay(b, c.spread) })
	}
}

func benchExpiryDelay(b *testing.B, spread time.Duration) {
	n := benchSize(100_000)
	const lost = 20 * time.Second
	for b.Loop() {
		e := newEnv(b, lost)
		f := e.collectFacts()
		_, reg, stop := e.start(Config{PartitionCount: testPartitions, LostAfter: lost})
		e.reading("warmup")
		cpu0 := testenv.SelfCPU()
		start := time.Now()
		at := appendReadingsOver(b, e.nats.JS, n, spread)
		b.Logf("appended %d readings in %s; deadlines from %s to %s after start", n, time.Since(start).Round(time.Millisecond),
			at[0].Add(lost).Sub(start).Round(time.Millisecond), at[n-1].Add(lost).Sub(start).Round(time.Millisecond))
		// LOCKS_BENCH_CPUPROFILE profiles from here, the appends done, to the last fact: the
		// expiries and their settling, without the appends that set them up.
		stopProfile := startCPUProfile(b, os.Getenv("LOCKS_BENCH_CPUPROFILE"))
		deadline := at[n-1].Add(lost + 5*time.Minute)
		for {
			f.mu.Lock()
			got := len(f.all)
			f.mu.Unlock()
			if got >= n+1 {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("%d of %d facts within 5 minutes of the last deadline", got, n+1)
			}
			time.Sleep(100 * time.Millisecond)
		}
		stopProfile()
		idx := map[string]int{}
		for i := 0; i < n; i++ {
			idx[sensorName(i)] = i
		}
		var delays []time.Duration
		f.mu.Lock()
		for _, s := range f.all {
			i, ok := idx[s.fact.SensorID]
			if !ok {
				continue
			}
			delays = append(delays, s.seen.Sub(at[i].Add(lost)))
		}
		f.mu.Unlock()
		slices.Sort(delays)
		p := func(q float64) time.Duration { return delays[int(q*float64(len(delays)-1))] }
		mfs, _ := reg.Gather()
		for _, mf := range mfs {
			if h := mf.GetMetric()[0].GetHistogram(); h != nil && h.GetSampleCount() > 0 {
				b.Logf("%s: mean %.3fs over %d", mf.GetName(), h.GetSampleSum()/float64(h.GetSampleCount()), h.GetSampleCount())
			}
		}
		// The process's CPU over the run (appends, NATS, the watchdog and this collector):
		// steadier than the delays on a shared machine, and what the delays grow with.
		b.ReportMetric(float64((testenv.SelfCPU()-cpu0).Microseconds())/float64(n), "cpu-µs/expiry")
		b.ReportMetric(p(0.5).Seconds(), "p50-s")
		b.ReportMetric(p(0.99).Seconds(), "p99-s")
		b.Logf("%d expiries: delay from deadline to fact in READINGS min %s p50 %s p99 %s max %s",
			len(delays), delays[0].Round(time.Millisecond), p(0.5).Round(time.Millisecond), p(0.99).Round(time.Millisecond), delays[len(delays)-1].Round(time.Millisecond))
		stop()
	}
}

// startCPUProfile writes a CPU profile to path until the returned stop is called; an
// empty path profiles nothing.
func startCPUProfile(b *testing.B, path string) (stop func()) {
	b.Helper()
	if path == "" {
		return func() {}
	}
	out, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	if err := pprof.StartCPUProfile(out); err != nil {
		b.Fatal(err)
	}
	return func() {
		pprof.StopCPUProfile()
		_ = out.Close()
	}
}

// BenchmarkWrittenMap measures the watchdog's own memory per tracked sensor: the map of
// refresh deadlines (the only per-sensor state it keeps while sensors report) filled with
// LOCKS_BENCH_SENSORS (default 1,000,000) sensors over 16 partitions, with lost_after 1h,
// as Go heap in use after a GC, without the NATS server and client buffers of BenchmarkTrack.
func BenchmarkWrittenMap(b *testing.B) {
	n := benchSize(1_000_000)
	const parts = 16
	for b.Loop() {
		w := &Watchdog{cfg: Config{PartitionCount: parts, LostAfter: time.Hour}, parts: map[int]*partState{}}
		empty := map[string]time.Duration{}
		w.overrides.Store(&empty)
		for p := range parts {
			w.parts[p] = &partState{}
		}
		heap0, _ := memFigures()
		now := time.Now()
		for i := range n {
			s := sensorName(i)
			w.needsRefresh(w.parts[partition.Of(s, parts)], s, now)
		}
		heap1, _ := memFigures()
		if got := w.writtenLen(); got != n {
			b.Fatalf("%d sensors remembered, want %d", got, n)
		}
		b.ReportMetric(heap1-heap0, "written-map-MB")
		b.ReportMetric((heap1-heap0)*(1<<20)/float64(n), "B/sensor")
	}
}
