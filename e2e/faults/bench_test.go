package faults_test

import (
	nethttp "net/http"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lock-sensors/lock-sensors/deploy/cluster"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
	"github.com/lock-sensors/lock-sensors/loadgen"
)

// benchDuration is how long each topology is fed (LOCKS_BENCH_CLUSTER_DURATION, default 20 s).
func benchDuration() time.Duration {
	if d, err := time.ParseDuration(os.Getenv("LOCKS_BENCH_CLUSTER_DURATION")); err == nil && d > 0 {
		return d
	}
	return 20 * time.Second
}

// BenchmarkClusterIngest: the load generator publishes as fast as RabbitMQ confirms for
// benchDuration into the scaled topology (3 NATS nodes, R3 streams, 2 processes of each part)
// and, in the same run, into one `locks run --targets=all` with its embedded NATS; reported:
// readings/s committed to the state projection, publish start → the last one committed. On
// the cluster it then SIGKILLs one of the two state processes and reports the time until its
// partitions are all claimed by the other (takeover-s).
func BenchmarkClusterIngest(b *testing.B) {
	dur := benchDuration()
	b.Run("topology=single", func(b *testing.B) {
		srv := localServers(b)
		locks, _ := bins(b)
		chDB := testenv.Name("locks_single")
		b.Cleanup(func() { testenv.DropClickHouseDatabase(b, chDB) })
		addr := testenv.FreeAddr(b)
		cmd := exec.Command(locks, "run", "--targets=all")
		cmd.Env = append(os.Environ(), "LOCKS_POSTGRES_URL="+srv.pgURL, "LOCKS_CLICKHOUSE_URL=clickhouse://"+srv.chAddr+"/"+chDB,
			"LOCKS_AMQP_URL="+srv.amqpURL, "LOCKS_AMQP_QUEUE="+srv.queue, "LOCKS_API_TOKENS="+token,
			"LOCKS_PARTITIONS=8", "LOCKS_NATS_SYNC=1s", "LOCKS_HTTP_ADDR="+addr, "LOCKS_GRPC_ADDR="+testenv.FreeAddr(b),
			"LOCKS_NATS_LISTEN=127.0.0.1:0", "LOCKS_DATA_DIR="+b.TempDir())
		out := &testenv.LogBuffer{}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			_ = cmd.Wait()
			if b.Failed() {
				b.Logf("locks run:\n%s", out.String())
			}
		})
		testenv.Eventually(b, 2*time.Minute, "locks run to be ready", func() bool {
			resp, err := nethttp.Get("http://" + addr + "/readyz")
			if err != nil {
				return false
			}
			resp.Body.Close()
			return resp.StatusCode == nethttp.StatusOK
		})
		ingest(b, srv, dur, []string{"http://" + addr + "/metrics"})
	})
	b.Run("topology=cluster", func(b *testing.B) {
		srv := localServers(b)
		out := &testenv.LogBuffer{}
		c, err := cluster.Start(b.Context(), clusterConfig(b, srv, out))
		if err != nil {
			b.Fatalf("%v\n%s", err, out.String())
		}
		b.Cleanup(func() {
			c.Stop()
			if b.Failed() {
				b.Logf("cluster output:\n%s", out.String())
			}
		})
		var urls []string
		for _, p := range c.Of("state") {
			urls = append(urls, "http://"+p.HTTPAddr+"/metrics")
		}
		ingest(b, srv, dur, urls)

		// Takeover: both state processes own partitions, one is killed.
		testenv.Eventually(b, time.Minute, "both state processes to own partitions", func() bool { return bothOwn(c, "state") })
		pg, err := pgxpool.New(b.Context(), srv.pgURL)
		if err != nil {
			b.Fatal(err)
		}
		defer pg.Close()
		victim := c.Of("state")[0]
		at := time.Now()
		if err := victim.Signal(syscall.SIGKILL); err != nil {
			b.Fatal(err)
		}
		took, err := takeover(b.Context(), pg, "state", victim.Cmd.Process.Pid, at, time.Minute)
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(took.Seconds(), "takeover-s")
	})
}

// ingest publishes as fast as RabbitMQ confirms for dur and reports the publish rate and the
// rate at which the readings were committed (locks_state_applied_total summed over urls).
func ingest(b *testing.B, srv servers, dur time.Duration, urls []string) {
	base, err := loadgen.Scrape(b.Context(), urls, loadgen.MetricApplied)
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	books, err := loadgen.Run(b.Context(), loadgen.Config{AMQPURL: srv.amqpURL, Queue: srv.queue, Sensors: 10_000, Rate: 200_000,
		ChangeRatio: 0.1, Duration: dur, Prefix: "ci", Seed: 1}, nil, testenv.Logger(b))
	if err != nil {
		b.Fatal(err)
	}
	// Polled every 100 ms, not testenv.Eventually's 20 ms: the scrapes would take CPU from the run.
	for deadline := time.Now().Add(10 * time.Minute); ; {
		m, err := loadgen.Scrape(b.Context(), urls, loadgen.MetricApplied)
		if err == nil && m[loadgen.MetricApplied]-base[loadgen.MetricApplied] >= float64(books.Published) {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("not every reading committed within 10 minutes: %v (%v) of %d", m[loadgen.MetricApplied]-base[loadgen.MetricApplied], err, books.Published)
		}
		time.Sleep(100 * time.Millisecond)
	}
	committed := time.Since(books.Start)
	b.StopTimer()
	b.ReportMetric(float64(books.Published)/books.End.Sub(books.Start).Seconds(), "published/s")
	b.ReportMetric(float64(books.Published)/committed.Seconds(), "readings/s")
	b.ReportMetric(float64(books.Published), "readings")
}
