package e2e_test

import (
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lock-sensors/lock-sensors/internal/testenv"
	"github.com/lock-sensors/lock-sensors/loadgen"
)

// BenchmarkTracingOverhead is the CPU the `locks run --targets=all` process spends per
// reading, side by side in one run on the same fixed load: older builds
// (LOCKS_BENCH_BASE_BINS=name=path,…, e.g. the commit before tracing; none when unset), this
// build with tracing off (no OTLP endpoint), and this build exporting to a real OTLP/HTTP
// receiver at 100% and at 1% sampling (parentbased_traceidratio). The set-ups take turns,
// round after round (LOCKS_BENCH_TRACING_ROUNDS, default 3), so that a busier moment of the
// machine falls on each alike; the reported figure of each is its median round. Each round
// publishes LOCKS_BENCH_TRACING_RATE readings/s (default 2,000) over 1,000 sensors, 10% of
// them changes, for LOCKS_BENCH_TRACING_DURATION (default 15 s), and waits until the state
// projection has applied them all.
func BenchmarkTracingOverhead(b *testing.B) {
	rounds := 3
	if v, err := strconv.Atoi(os.Getenv("LOCKS_BENCH_TRACING_ROUNDS")); err == nil && v > 0 {
		rounds = v
	}
	rate := 2000
	if v, err := strconv.Atoi(os.Getenv("LOCKS_BENCH_TRACING_RATE")); err == nil && v > 0 {
		rate = v
	}
	dur := 15 * time.Second
	if v, err := time.ParseDuration(os.Getenv("LOCKS_BENCH_TRACING_DURATION")); err == nil && v > 0 {
		dur = v
	}
	type setup struct {
		name string
		bin  string
		env  func(tb testing.TB) []string
	}
	traced := func(ratio string) func(tb testing.TB) []string {
		return func(tb testing.TB) []string {
			return []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + testenv.OTLP(tb).URL,
				"OTEL_TRACES_SAMPLER=parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG=" + ratio}
		}
	}
	none := func(testing.TB) []string { return nil }
	var setups []setup
	for _, nb := range strings.Split(os.Getenv("LOCKS_BENCH_BASE_BINS"), ",") {
		if name, bin, ok := strings.Cut(nb, "="); ok {
			setups = append(setups, setup{name, bin, none})
		}
	}
	if len(setups) == 0 {
		b.Log("LOCKS_BENCH_BASE_BINS is not set: no figure of a build before tracing")
	}
	setups = append(setups, setup{"off", locksBin, none}, setup{"on100", locksBin, traced("1")}, setup{"on1", locksBin, traced("0.01")})
	for range b.N {
		per := map[string][]float64{}
		for round := range rounds {
			for _, su := range setups {
				v := tracingRound(b, su.bin, su.env(b), rate, dur)
				b.Logf("round %d %-6s %.1f cpu-µs/reading", round+1, su.name, v)
				per[su.name] = append(per[su.name], v)
			}
		}
		off := median(per["off"])
		for _, su := range setups {
			m := median(per[su.name])
			b.ReportMetric(m, su.name+"-cpu-µs/reading")
			// The spread of its rounds, to judge a difference against (the log is cut short).
			b.ReportMetric(slices.Min(per[su.name]), su.name+"-min-cpu-µs/reading")
			b.ReportMetric(slices.Max(per[su.name]), su.name+"-max-cpu-µs/reading")
			if su.name != "off" {
				// How much more (or less) than this build with tracing off, in percent.
				b.ReportMetric((m/off-1)*100, su.name+"-vs-off-%")
			}
		}
	}
}

// tracingRound runs one round of BenchmarkTracingOverhead on bin with env and returns the
// process's CPU per reading in microseconds.
func tracingRound(b *testing.B, bin string, env []string, rate int, dur time.Duration) float64 {
	s := startBin(b, bin, env...)
	defer s.stop()
	machine := testenv.StartCPU(s.components())
	books, err := loadgen.Run(b.Context(), loadgen.Config{
		AMQPURL: s.rabbit.URL, Queue: s.rabbit.Queue, Sensors: 1000, Rate: float64(rate),
		ChangeRatio: 0.1, Duration: dur, Prefix: "tr", Seed: 1,
	}, nil, testenv.Logger(b))
	if err != nil {
		b.Fatal(err)
	}
	testenv.Eventually(b, 5*time.Minute, "the state projection caught up", func() bool {
		return s.metric("locks_state_applied_total") >= float64(books.Published)
	})
	use := machine.Stop()
	return use[0].Seconds / float64(books.Published) * 1e6
}

// median is the middle value of v (the mean of the two middle ones for an even count).
func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// stop ends the process with SIGTERM and waits for it (the test's cleanup then finds it gone).
func (s *system) stop() {
	s.t.Helper()
	_ = s.proc.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(20 * time.Second):
		_ = s.proc.Kill()
		<-s.exited
	}
}
