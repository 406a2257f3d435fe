package e2e_test

import (
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"testing"
	"time"
)

// BenchmarkModerateLatency is a reading's whole way (RabbitMQ publish → the webhook received)
// at an ordinary load: 500 readings/s over 200 sensors, 30% of them changes, one client with a
// fast receiver, through `locks loadgen --webhooks` against one `locks run --targets=all`.
// Users feel this long before any ceiling. It runs under both sync settings of the embedded
// store; LOCKS_BENCH_LOCKS_BIN runs another build (an older commit's) on the same load, and
// LOCKS_BENCH_MODERATE_COUNT sets the readings per run (10,000 by default, 20 s).
func BenchmarkModerateLatency(b *testing.B) {
	count := 10_000
	if v, err := strconv.Atoi(os.Getenv("LOCKS_BENCH_MODERATE_COUNT")); err == nil && v > 0 {
		count = v
	}
	line := regexp.MustCompile(`publish→webhook p50 (\S+) p95 (\S+) p99 (\S+)\n`)
	for _, sync := range []string{"2m", "always"} {
		b.Run("sync="+sync, func(b *testing.B) {
			for range b.N {
				s := start(b, "LOCKS_NATS_SYNC="+sync)
				cmd := exec.Command(locksBin, "loadgen", "--webhooks", "--sensors=200", "--rate=500",
					"--count="+strconv.Itoa(count), "--change-ratio=0.3", "--settle=60s", "--prefix=ml", "--seed=26")
				cmd.Env = append(os.Environ(),
					"LOCKS_AMQP_URL="+s.rabbit.URL, "LOCKS_AMQP_QUEUE="+s.rabbit.Queue,
					"LOCKS_HTTP_ADDR="+s.http, "LOCKS_API_TOKENS="+s.token)
				var out syncBuffer
				cmd.Stdout, cmd.Stderr = &out, &out
				b.ResetTimer()
				err := cmd.Run()
				b.StopTimer()
				text := out.String()
				if err != nil {
					b.Fatalf("locks loadgen: %v\n%s", err, text)
				}
				m := line.FindStringSubmatch(text)
				if m == nil {
					b.Fatalf("no publish→webhook line in:\n%s", text)
				}
				for i, name := range []string{"p50", "p95", "p99"} {
					d, err := time.ParseDuration(m[i+1])
					if err != nil {
						b.Fatal(err)
					}
					b.ReportMetric(float64(d.Microseconds())/1000, "webhook_"+name+"_ms")
				}
			}
		})
	}
}
