package api

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"sync"
	"testing"
	"time"
)

// BenchmarkGetState drives GET /v1/sensors/{id}/state over REST (HTTP → gateway → gRPC →
// Postgres) at a fixed rate (LOCKS_BENCH_RATE, default 2000/s) for LOCKS_BENCH_DURATION
// (default 5s) on loopback, with at most 64 requests in flight, and reports the latency
// percentiles. Latency counts from when a request was due, not when it was sent, so a
// stalled server shows in the figures instead of slowing the load (no coordinated omission).
//
//	go test -run '^$' -bench BenchmarkGetState -benchtime 1x ./api/
func BenchmarkGetState(b *testing.B) {
	rate := envInt(b, "LOCKS_BENCH_RATE", 2000)
	dur := envDuration(b, "LOCKS_BENCH_DURATION", 5*time.Second)
	const (
		sensors  = 1000
		inFlight = 64
	)
	e := newEnv(b, withStderrLog())
	if _, err := e.db.Exec(b.Context(), `
		INSERT INTO sensor_state (sensor_id, partition, data, last_seen, last_reading_time, changed_at, revision, connection, last_seq)
		SELECT 'B' || g, g % 16, g % 2, now(), now(), now(), g, 'online', g FROM generate_series(1, $1) g`, sensors); err != nil {
		b.Fatal(err)
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: inFlight, MaxConnsPerHost: inFlight}, Timeout: 10 * time.Second}
	get := func(ctx context.Context, i int) error {
		req, _ := http.NewRequestWithContext(ctx, "GET", fmt.Sprintf("%s/v1/sensors/B%d/state", e.url, 1+i%sensors), nil)
		req.Header.Set("Authorization", "Bearer "+testToken)
		res, err := client.Do(req)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
		if res.StatusCode != 200 {
			return fmt.Errorf("status %d", res.StatusCode)
		}
		return nil
	}
	// Warm up connections and caches.
	for i := range 200 {
		if err := get(b.Context(), i); err != nil {
			b.Fatal(err)
		}
	}

	b.ResetTimer()
	for range b.N {
		r := fixedRate(b.Context(), rate, dur, inFlight, get)
		b.ReportMetric(ms(r.percentile(0.50)), "p50-ms")
		b.ReportMetric(ms(r.percentile(0.99)), "p99-ms")
		b.ReportMetric(ms(r.percentile(0.999)), "p99.9-ms")
		b.ReportMetric(float64(r.done)/r.elapsed.Seconds(), "req/s")
		b.ReportMetric(float64(r.errors), "errors")
		b.ReportMetric(float64(r.late), "late")
		b.Logf("%d requests in %s at %d/s target: p50 %.2fms p99 %.2fms p99.9 %.2fms max %.2fms, %d errors (first: %v), %d started late by more than 10ms",
			r.done, r.elapsed.Round(time.Millisecond), rate, ms(r.percentile(.5)), ms(r.percentile(.99)), ms(r.percentile(.999)), ms(r.percentile(1)), r.errors, r.firstErr, r.late)
		if r.errors > 0 {
			b.Errorf("%d requests failed; first: %v", r.errors, r.firstErr)
		}
	}
}

type loadResult struct {
	latencies []time.Duration
	done      int
	errors    int
	late      int // sent more than 10ms after they were due (the load generator fell behind)
	firstErr  error
	elapsed   time.Duration
}

func (r loadResult) percentile(p float64) time.Duration {
	if len(r.latencies) == 0 {
		return 0
	}
	i := int(p * float64(len(r.latencies)-1))
	return r.latencies[i]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// fixedRate calls do rate times a second for dur with at most inFlight calls at once, and
// measures each from the moment it was due.
func fixedRate(ctx context.Context, rate int, dur time.Duration, inFlight int, do func(context.Context, int) error) loadResult {
	type job struct {
		i   int
		due time.Time
	}
	jobs := make(chan job, rate) // up to a second of backlog; beyond that the generator waits
	var mu sync.Mutex
	var r loadResult
	var wg sync.WaitGroup
	for range inFlight {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var lat []time.Duration
			var errs, late int
			var first error
			for j := range jobs {
				if time.Since(j.due) > 10*time.Millisecond {
					late++
				}
				err := do(ctx, j.i)
				lat = append(lat, time.Since(j.due))
				if err != nil {
					if first == nil {
						first = err
					}
					errs++
				}
			}
			mu.Lock()
			r.latencies = append(r.latencies, lat...)
			r.errors += errs
			r.late += late
			if r.firstErr == nil {
				r.firstErr = first
			}
			mu.Unlock()
		}()
	}
	interval := time.Second / time.Duration(rate)
	start := time.Now()
	n := int(dur / interval)
	for i := range n {
		due := start.Add(time.Duration(i) * interval)
		if d := time.Until(due); d > 0 {
			time.Sleep(d)
		}
		if ctx.Err() != nil {
			break
		}
		jobs <- job{i, due}
	}
	close(jobs)
	wg.Wait()
	r.elapsed = time.Since(start)
	r.done = len(r.latencies)
	slices.Sort(r.latencies)
	return r
}

func envInt(b *testing.B, k string, def int) int {
	if v := os.Getenv(k); v != "" {
		var n int
		if _, err := fmt.Sscanf(v, "%d", &n); err != nil || n <= 0 {
			b.Fatalf("%s=%q: want a positive integer", k, v)
		}
		return n
	}
	return def
}

func envDuration(b *testing.B, k string, def time.Duration) time.Duration {
	if v := os.Getenv(k); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			b.Fatalf("%s=%q: want a positive duration", k, v)
		}
		return d
	}
	return def
}
