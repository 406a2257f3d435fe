package e2e_test

import (
	"fmt"
	"math"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// BenchmarkModerateLatency is a reading's whole way (RabbitMQ publish → the webhook received)
// at an ordinary load: 500 readings/s over 200 sensors, 30% of them changes, one client with a
// fast receiver, through `locks loadgen --webhooks` against one `locks run --targets=all`.
// Users feel this long before any ceiling. It runs under both sync settings of the embedded
// store; LOCKS_BENCH_LOCKS_BIN runs another build (an older commit's) on the same load (the
// load itself always comes from this build's loadgen), and LOCKS_BENCH_MODERATE_COUNT sets
// the readings per run (10,000 by default, 20 s). Besides the whole run, from a process just
// started, it reports the run without its first five seconds (webhook_warm_*): the steady
// state of an ordinary load.
func BenchmarkModerateLatency(b *testing.B) {
	count := 10_000
	if v, err := strconv.Atoi(os.Getenv("LOCKS_BENCH_MODERATE_COUNT")); err == nil && v > 0 {
		count = v
	}
	line := regexp.MustCompile(`publish→webhook p50 (\S+) p95 (\S+) p99 (\S+)\n`)
	warm := regexp.MustCompile(`after the first 5s: \d+ webhooks; publish→webhook p50 (\S+) p95 (\S+) p99 (\S+)\n`)
	for _, sync := range []string{"2m", "always"} {
		b.Run("sync="+sync, func(b *testing.B) {
			for range b.N {
				s := start(b, "LOCKS_NATS_SYNC="+sync)
				cmd := exec.Command(toolBin, "loadgen", "--webhooks", "--sensors=200", "--rate=500",
					"--count="+strconv.Itoa(count), "--change-ratio=0.3", "--settle=60s", "--prefix=ml", "--seed=26", "--warmup=5s")
				cmd.Env = append(os.Environ(),
					"LOCKS_AMQP_URL="+s.rabbit.URL, "LOCKS_AMQP_QUEUE="+s.rabbit.Queue,
					"LOCKS_HTTP_ADDR="+s.http, "LOCKS_API_TOKENS="+s.token)
				var out syncBuffer
				cmd.Stdout, cmd.Stderr = &out, &out
				cpu0, _ := testenv.ProcCPU(s.pid)
				b.ResetTimer()
				err := cmd.Run()
				b.StopTimer()
				// The locks process's CPU per reading over the run (its settle included).
				if cpu1, ok := testenv.ProcCPU(s.pid); ok {
					b.ReportMetric((cpu1-cpu0)/float64(count)*1e6, "locks_cpu_us/reading")
				}
				text := out.String()
				if err != nil {
					b.Fatalf("locks loadgen: %v\n%s", err, text)
				}
				for _, r := range []struct {
					re     *regexp.Regexp
					prefix string
				}{{line, "webhook_"}, {warm, "webhook_warm_"}} {
					m := r.re.FindStringSubmatch(text)
					if m == nil {
						b.Fatalf("no %q line in:\n%s", r.re, text)
					}
					for i, name := range []string{"p50", "p95", "p99"} {
						d, err := time.ParseDuration(m[i+1])
						if err != nil {
							b.Fatal(err)
						}
						b.ReportMetric(float64(d.Microseconds())/1000, r.prefix+name+"_ms")
					}
				}
				// Where it waited: the median of each hop (locks_stage_seconds).
				stages, err := stageMedians("http://" + s.http + "/metrics")
				if err != nil && os.Getenv("LOCKS_BENCH_LOCKS_BIN") != "" {
					b.Logf("no stage split from this build: %v", err) // a build from before the split
					continue
				}
				if err != nil {
					b.Fatal(err)
				}
				for _, st := range []string{"sensor", "append", "state", "relay", "intake", "claim", "attempt", "finish"} {
					v, ok := stages[st]
					if !ok {
						b.Fatalf("no locks_stage_seconds{stage=%q} observed", st)
					}
					b.ReportMetric(v*1000, st+"_p50_ms")
				}
			}
		})
	}
}

// stageMedians reads every stage's median from the process's locks_stage_seconds histogram,
// interpolated within its bucket; a stage with no observation is left out.
func stageMedians(url string) (map[string]float64, error) { return stageQuantiles(url, 0.5) }

// stageQuantiles reads every stage's q-quantile (0 < q < 1) from the process's
// locks_stage_seconds histogram, as stageMedians does the median.
func stageQuantiles(url string, q float64) (map[string]float64, error) {
	resp, err := http.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", url, err)
	}
	mf, ok := mfs["locks_stage_seconds"]
	if !ok {
		return nil, fmt.Errorf("%s has no locks_stage_seconds", url)
	}
	out := map[string]float64{}
	for _, m := range mf.GetMetric() {
		h := m.GetHistogram()
		n := float64(h.GetSampleCount())
		if n == 0 {
			continue
		}
		lo, below := 0.0, 0.0
		for _, bk := range h.GetBucket() {
			c := float64(bk.GetCumulativeCount())
			if c >= n*q {
				hi := bk.GetUpperBound()
				if math.IsInf(hi, 1) {
					hi = lo
				}
				out[m.GetLabel()[0].GetValue()] = lo + (hi-lo)*(n*q-below)/max(c-below, 1)
				break
			}
			lo, below = bk.GetUpperBound(), c
		}
	}
	return out, nil
}
