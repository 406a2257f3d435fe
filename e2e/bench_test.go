package e2e_test

import (
	"context"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lock-sensors/lock-sensors/internal/testenv"
	"github.com/lock-sensors/lock-sensors/loadgen"
)

// metric reads the sum of a counter's series from the process's /metrics (-1 if it cannot).
func (s *system) metric(name string) float64 {
	m, err := loadgen.Scrape(context.Background(), []string{"http://" + s.http + "/metrics"}, name)
	if err != nil {
		return -1
	}
	return m[name]
}

// components are the `locks run` process (locks-process-cpu-µs/reading, also reported as cpu-µs/reading) and the servers.
func (s *system) components() []testenv.Component {
	return append([]testenv.Component{{Name: "locks-process", CPU: testenv.PidCPU(s.pid)}}, testenv.Servers()...)
}

// BenchmarkEndToEndIngest: the whole system (`locks run --targets=all`, one process, embedded
// NATS) takes readings from the load generator publishing into RabbitMQ as fast as it can
// under confirms, for LOCKS_BENCH_E2E_DURATION (default 60 s), all on this machine. Reported:
// the publish rate, the rate at which readings were committed to the state projection
// (publish start → last reading committed), their ratio, and the lag from publish to the
// state projection (sampled every 250 ms as now − the newest committed reading's ts).
//
// Also reported: the CPU the process spent per reading (from /proc over the run, divided by
// the readings: cpu-µs/reading), split between locks' own code and the embedded NATS server
// by a CPU profile of the publishing phase (natsShare), the state projector's mean batch, and
// the waits for a connection of the Postgres pool the parts share.
//
// It runs once per sync policy of the embedded NATS store (LOCKS_NATS_SYNC), side by side in
// one run, so that the cost of fsync on every write is measured on the same machine and load:
// sync=2m is nats-server's default, sync=always what docs/operations.md, "Durability", chooses.
func BenchmarkEndToEndIngest(b *testing.B) {
	dur := 60 * time.Second
	if v, err := time.ParseDuration(os.Getenv("LOCKS_BENCH_E2E_DURATION")); err == nil {
		dur = v
	}
	// A fixed rate (LOCKS_BENCH_E2E_RATE) compares the CPU per reading of two builds on a
	// machine whose load varies: as fast as possible, a busier moment means smaller batches.
	rate := 200_000
	if v, err := strconv.Atoi(os.Getenv("LOCKS_BENCH_E2E_RATE")); err == nil && v > 0 {
		rate = v
	}
	for _, sync := range []string{"2m", "always"} {
		b.Run("sync="+sync, func(b *testing.B) { benchIngest(b, dur, rate, "LOCKS_NATS_SYNC="+sync) })
	}
}

func benchIngest(b *testing.B, dur time.Duration, rate int, env ...string) {
	for range b.N {
		s := start(b, append([]string{"LOCKS_PPROF=true"}, env...)...)
		pool, err := pgxpool.New(b.Context(), s.pgURL)
		if err != nil {
			b.Fatal(err)
		}
		defer pool.Close()
		b.ResetTimer()
		batches0 := s.metric("locks_state_batch_size_count")
		waits0, waited0 := s.metric("locks_postgres_pool_empty_acquires_total"), s.metric("locks_postgres_pool_empty_wait_seconds_total")
		prof := s.cpuProfile(b.Context(), dur)
		machine := testenv.StartCPU(s.components())
		type res struct {
			books loadgen.Books
			err   error
		}
		done := make(chan res, 1)
		go func() {
			books, err := loadgen.Run(b.Context(), loadgen.Config{
				AMQPURL: s.rabbit.URL, Queue: s.rabbit.Queue, Sensors: 10_000, Rate: float64(rate),
				ChangeRatio: 0.1, Duration: dur, Prefix: "e2e", Seed: 1,
			}, nil, testenv.Logger(b))
			done <- res{books, err}
		}()
		var lags []time.Duration
		var r res
		published := false
		deadline := time.Now().Add(dur + 5*time.Minute)
		for {
			var newest time.Time
			if err := pool.QueryRow(b.Context(), "SELECT coalesce(max(last_reading_time), 'epoch') FROM sensor_state").Scan(&newest); err == nil && newest.Unix() > 0 {
				lags = append(lags, time.Since(newest))
			}
			if !published {
				select {
				case r = <-done:
					if r.err != nil {
						b.Fatal(r.err)
					}
					published = true
				default:
				}
			}
			if published && s.metric("locks_state_applied_total") >= float64(r.books.Published) {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("state projection did not catch up: %v of %d applied", s.metric("locks_state_applied_total"), r.books.Published)
			}
			time.Sleep(250 * time.Millisecond)
		}
		committed := time.Since(r.books.Start)
		batches := s.metric("locks_state_batch_size_count") - batches0
		waits, waited := s.metric("locks_postgres_pool_empty_acquires_total")-waits0, s.metric("locks_postgres_pool_empty_wait_seconds_total")-waited0
		use := machine.Stop()
		cpu := use[0].Seconds // locks-process
		b.StopTimer()
		p, err := prof()
		if err != nil {
			b.Fatalf("CPU profile: %v", err)
		}
		saveProfile(b, p)
		if applied := s.metric("locks_state_applied_total"); applied != float64(r.books.Published) {
			b.Fatalf("books: %v readings applied to the state, %d published", applied, r.books.Published)
		}
		pubRate := float64(r.books.Published) / r.books.End.Sub(r.books.Start).Seconds()
		stateRate := float64(r.books.Published) / committed.Seconds()
		slices.Sort(lags)
		q := func(p float64) float64 { return lags[int(p*float64(len(lags)-1))].Seconds() * 1000 }
		b.ReportMetric(pubRate, "published/s")
		b.ReportMetric(stateRate, "readings/s")
		b.ReportMetric(stateRate/pubRate, "ratio")
		b.ReportMetric(q(0.5), "p50-lag-ms")
		b.ReportMetric(q(0.99), "p99-lag-ms")
		b.ReportMetric(float64(r.books.Published), "readings")
		perReading := cpu / float64(r.books.Published) * 1e6
		share := natsShare(p)
		b.ReportMetric(perReading, "cpu-µs/reading")
		b.ReportMetric(perReading*(1-share), "locks-cpu-µs/reading")
		b.ReportMetric(perReading*share, "nats-cpu-µs/reading")
		testenv.ReportCPUPer(b, use, float64(r.books.Published), "reading")
		// Each batch is one Postgres transaction and one ack: fewer, larger ones cost less.
		b.ReportMetric(float64(r.books.Published)/batches, "readings/state-batch")
		if s.metric("locks_postgres_pool_max_conns") > 0 { // a build without the pool's metrics has none
			// Whether the parts starve for the one Postgres pool they share.
			b.ReportMetric(waits, "pg-empty-acquires")
			b.ReportMetric(waited/float64(r.books.Published)*1e6, "pg-wait-µs/reading")
		}
	}
}
