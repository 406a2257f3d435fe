package main

import (
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const benchOutput = `goos: linux
pkg: github.com/lock-sensors/lock-sensors/e2e
BenchmarkSoak-2   	       1	73312406559 ns/op	         0 duplicates	         6.4 loadgen-cpu%	         6.3 locks-bridge-cpu%	         0 missing	      2999 published/s	        11.2 rabbitmq-cpu%	    180000 readings	       120.2 state-p50-ms	       394.2 state-p95-ms	       675.4 state-p99-ms	       131.8 total-cpu%	       90.5 webhook-p50-ms	       200.1 webhook-p95-ms	       280.9 webhook-p99-ms
BenchmarkScaling/partitions=1-2         	       1	4908304451 ns/op	      11343 readings/s	    54000 readings	        21.7 locks-state-cpu%	        23.2 locks-bridge-cpu%	       130.1 total-cpu%
BenchmarkScaling/partitions=2-2         	       1	4908304451 ns/op	       8110 readings/s	   107000 readings	        24.7 locks-state-cpu%	        17.5 locks-bridge-cpu%	       127.5 total-cpu%
`

const seriesCSV = `t_s,published_per_s,recorded_per_s,applied_per_s,webhooks_per_s,webhook_p50_ms,webhook_p99_ms,state_p50_ms,state_p99_ms,state_lag_ms
1.0,3000,2990,2980,300,90,200,80,150,20
2.0,3000,3010,3020,,,,81,160,
3.0,3000,3000,3000,310,95,210,79,155,25
`

const cdf = `q,state_ms,webhook_ms
0.000,10,20
0.500,80,90
1.000,300,
`

// The report has the soak's figures, the scaling and CPU tables with one column per run,
// and links to PNGs that exist and decode; the main table leaves the CPU figures to theirs.
func TestRender(t *testing.T) {
	dir := t.TempDir()
	for name, body := range map[string]string{"soak-series.csv": seriesCSV, "soak-latency.csv": cdf} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	rs := parse(strings.NewReader(benchOutput))
	plotDir := filepath.Join(dir, "docs", "bench")
	plots, err := renderPlots(dir, plotDir, rs)
	if err != nil {
		t.Fatal(err)
	}
	if len(plots) != 4 {
		t.Fatalf("%d plots, want throughput, latency, distribution and scaling: %v", len(plots), plots)
	}
	for _, p := range plots {
		f, err := os.Open(p.file)
		if err != nil {
			t.Fatal(err)
		}
		_, err = png.Decode(f)
		f.Close()
		if err != nil {
			t.Fatalf("%s: %v", p.file, err)
		}
	}
	doc := render(rs, "go tool task bench", plots, dir)
	for _, want := range []string{
		"180000 readings at 2999/s",
		"publish → state p50/p95/p99 120 / 394 / 675 ms",
		"| 1 | 11343 | 54000 | 22 | 23 | 130 |",
		"| component | Soak | Scaling/partitions=1 | Scaling/partitions=2 |",
		"| locks-bridge | 6.3 | 23.2 | 17.5 |",
		"| locks-state | | 21.7 | 24.7 |",
		"![throughput over time](docs/bench/soak-throughput.png)",
		"![scaling curve](docs/bench/scaling.png)",
	} {
		if !strings.Contains(doc, want) {
			t.Errorf("report lacks %q:\n%s", want, doc)
		}
	}
	if strings.Contains(doc, "cpu%,") || strings.Contains(doc, "-cpu% |") {
		t.Errorf("CPU figures leaked into the main table:\n%s", doc)
	}
	if i, j := strings.Index(doc, "| locks-bridge |"), strings.Index(doc, "| total |"); i < 0 || j < i {
		t.Errorf("components out of order:\n%s", doc)
	}
}
