package main

import (
	"encoding/csv"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// table is a CSV file with a header: its columns by name.
type table map[string][]float64

// readTable reads a CSV written by loadgen.WriteSeries or WriteCDF; empty cells are NaN.
func readTable(path string) (table, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	rows, err := csv.NewReader(f).ReadAll()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(rows) < 2 {
		return nil, fmt.Errorf("%s: no data", path)
	}
	t := table{}
	for _, r := range rows[1:] {
		for i, name := range rows[0] {
			v := math.NaN()
			if i < len(r) && r[i] != "" {
				if v, err = strconv.ParseFloat(r[i], 64); err != nil {
					return nil, fmt.Errorf("%s: %s: %w", path, name, err)
				}
			}
			t[name] = append(t[name], v)
		}
	}
	return t, nil
}

// xy pairs two columns, leaving out the points where either is NaN (or, for a log axis, not
// positive).
func xy(xs, ys []float64, positive bool) plotter.XYs {
	var out plotter.XYs
	for i := range min(len(xs), len(ys)) {
		x, y := xs[i], ys[i]
		if math.IsNaN(x) || math.IsNaN(y) || positive && (x <= 0 || y <= 0) {
			continue
		}
		out = append(out, plotter.XY{X: x, Y: y})
	}
	return out
}

// series is one named line.
type series struct {
	name string
	xys  plotter.XYs
}

func linePlot(path, title, xlabel, ylabel string, logX, logY bool, ss ...series) error {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = xlabel
	p.Y.Label.Text = ylabel
	if logX {
		p.X.Scale, p.X.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
	}
	if logY {
		p.Y.Scale, p.Y.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
	}
	p.Add(plotter.NewGrid())
	p.Legend.Top = true
	var args []any
	for _, s := range ss {
		if len(s.xys) > 0 {
			args = append(args, s.name, s.xys)
		}
	}
	if len(args) == 0 {
		return errors.New("no data to plot")
	}
	if err := plotutil.AddLines(p, args...); err != nil {
		return err
	}
	// Room above the data for the legend.
	if logY {
		p.Y.Max *= 4
	} else {
		p.Y.Max += (p.Y.Max - p.Y.Min) * 0.35
	}
	return p.Save(9*vg.Inch, 4*vg.Inch, path)
}

// plot is one PNG written, for the report.
type plotFile struct{ title, file string }

// renderPlots draws the soak's throughput and latency over time and its latency
// distribution from dir/soak-series.csv and dir/soak-latency.csv, and the scaling curve from
// the results, into outDir. Missing inputs leave their plot out.
func renderPlots(dir, outDir string, rs []result) ([]plotFile, error) {
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return nil, err
	}
	var done []plotFile
	if s, err := readTable(filepath.Join(dir, "soak-series.csv")); err == nil {
		t := s["t_s"]
		f := filepath.Join(outDir, "soak-throughput.png")
		if err := linePlot(f, "Soak: throughput per second", "seconds since publishing started", "per second", false, false,
			series{"published (RabbitMQ confirmed)", xy(t, s["published_per_s"], false)},
			series{"recorded (bridge → READINGS)", xy(t, s["recorded_per_s"], false)},
			series{"committed to sensor_state", xy(t, s["applied_per_s"], false)},
			series{"webhooks received", xy(t, s["webhooks_per_s"], false)}); err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		done = append(done, plotFile{"throughput over time", f})
		f = filepath.Join(outDir, "soak-latency.png")
		if err := linePlot(f, "Soak: latency of what arrived in each second (log scale)", "seconds since publishing started", "ms", false, true,
			series{"publish → state p50", xy(t, s["state_p50_ms"], true)},
			series{"publish → state p99", xy(t, s["state_p99_ms"], true)},
			series{"publish → webhook p50", xy(t, s["webhook_p50_ms"], true)},
			series{"publish → webhook p99", xy(t, s["webhook_p99_ms"], true)},
			series{"state lag (now − newest reading in state)", xy(t, s["state_lag_ms"], true)}); err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		done = append(done, plotFile{"latency over time", f})
	}
	if c, err := readTable(filepath.Join(dir, "soak-latency.csv")); err == nil {
		f := filepath.Join(outDir, "soak-latency-cdf.png")
		if err := linePlot(f, "Soak: latency distribution (CDF, log scale)", "ms", "fraction at or below", true, false,
			series{"publish → state", xy(c["state_ms"], c["q"], true)},
			series{"publish → webhook", xy(c["webhook_ms"], c["q"], true)}); err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		done = append(done, plotFile{"latency distribution", f})
	}
	var got plotter.XYs
	for _, r := range rs {
		if n, ok := scalingN(r.name); ok {
			got = append(got, plotter.XY{X: float64(n), Y: r.metrics["readings/s"]})
		}
	}
	if len(got) > 0 {
		f := filepath.Join(outDir, "scaling.png")
		if err := linePlot(f, "Scaling: partitions = state projector processes", "partitions (and state processes)", "readings/s", false, false,
			series{"RabbitMQ backlog → committed to state, readings/s", got}); err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		done = append(done, plotFile{"scaling curve", f})
	}
	return done, nil
}

// scalingN is N of a BenchmarkScaling/partitions=N result.
func scalingN(name string) (int, bool) {
	v, ok := strings.CutPrefix(name, "BenchmarkScaling/partitions=")
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(v)
	return n, err == nil
}

const cpuSuffix = "-cpu%"

// renderCPU is the table of CPU per component (% of one core) of the soak and of each
// scaling step, one column each.
func renderCPU(b *strings.Builder, rs []result) {
	var cols []result
	for _, r := range rs {
		if r.name == "BenchmarkSoak" {
			cols = append([]result{r}, cols...)
		} else if _, ok := scalingN(r.name); ok {
			cols = append(cols, r)
		}
	}
	if len(cols) == 0 {
		return
	}
	var comps []string
	seen := map[string]bool{}
	for _, r := range cols {
		for _, u := range r.units {
			if c, ok := strings.CutSuffix(u, cpuSuffix); ok && !seen[c] {
				seen[c] = true
				comps = append(comps, c)
			}
		}
	}
	// The system's processes in start order, then the servers, the load generator, the total.
	order := []string{"locks-bridge", "locks-state", "locks-history", "locks-notifier", "locks-watchdog", "locks-api",
		"nats-server", "rabbitmq", "postgres", "clickhouse", "loadgen", "total"}
	rank := func(c string) int {
		if i := slices.Index(order, c); i >= 0 {
			return i
		}
		return len(order)
	}
	slices.SortStableFunc(comps, func(a, b string) int { return rank(a) - rank(b) })
	b.WriteString("\nCPU per component over the run, in % of one core (the machine has 2 cores, so 200% is all of it); " +
		"read from /proc/<pid>/stat (utime + stime, plus children that exited) before and after. " +
		"`locks-*` are the `locks run --targets=<part>` processes; `loadgen` is the benchmark process " +
		"(publisher, webhook receiver, samplers); the servers are shared with whatever else ran on the machine meanwhile.\n\n")
	b.WriteString("| component |")
	for _, r := range cols {
		fmt.Fprintf(b, " %s |", strings.TrimPrefix(r.name, "Benchmark"))
	}
	b.WriteString("\n| --- |" + strings.Repeat(" ---: |", len(cols)) + "\n")
	for _, c := range comps {
		fmt.Fprintf(b, "| %s |", c)
		for _, r := range cols {
			if v, ok := r.metrics[c+cpuSuffix]; ok {
				fmt.Fprintf(b, " %.1f |", v)
			} else {
				b.WriteString(" |")
			}
		}
		b.WriteString("\n")
	}
}

// renderScaling is the scaling curve as a table.
func renderScaling(b *strings.Builder, rs []result) {
	var rows []string
	for _, r := range rs {
		n, ok := scalingN(r.name)
		if !ok {
			continue
		}
		m := r.metrics
		rows = append(rows, fmt.Sprintf("| %d | %s | %s | %.0f | %.0f | %.0f |", n, human(m["readings/s"]), human(m["readings"]),
			m["locks-state"+cpuSuffix], m["locks-bridge"+cpuSuffix], m["total"+cpuSuffix]))
	}
	if len(rows) == 0 {
		return
	}
	b.WriteString("\nScaling curve (`e2e` BenchmarkScaling): partitions = state projector processes, one bridge process; " +
		"a RabbitMQ backlog (filled first, with no bridge running) drained through the bridge into READINGS and committed to sensor_state.\n\n" +
		"| partitions = state processes | readings/s committed | readings | state processes CPU % | bridge CPU % | all components CPU % |\n" +
		"| ---: | ---: | ---: | ---: | ---: | ---: |\n")
	b.WriteString(strings.Join(rows, "\n") + "\n")
}

// renderSoak is the must-show run in words and the plots.
func renderSoak(b *strings.Builder, rs []result, plots []plotFile, docDir string) {
	for _, r := range rs {
		if r.name != "BenchmarkSoak" {
			continue
		}
		m := r.metrics
		fmt.Fprintf(b, "\nSoak (`e2e` BenchmarkSoak, every part its own process): %s readings at %s/s; "+
			"publish → state p50/p95/p99 %s / %s / %s ms; publish → webhook p50/p95/p99 %s / %s / %s ms; "+
			"%s changes expected, %s webhooks received, %s missing, %s duplicated, %s bad signatures; "+
			"%s readings not recorded; largest state lag %s ms; %s changes not yet notified when publishing ended, all in %s s after.\n",
			human(m["readings"]), human(m["published/s"]), human(m["state-p50-ms"]), human(m["state-p95-ms"]), human(m["state-p99-ms"]),
			human(m["webhook-p50-ms"]), human(m["webhook-p95-ms"]), human(m["webhook-p99-ms"]),
			human(m["changes"]), human(m["webhooks"]), human(m["missing"]), human(m["duplicates"]), human(m["bad-signatures"]),
			human(m["unrecorded"]), human(m["max-lag-ms"]), human(m["backlog-at-end"]), human(m["settle-s"]))
	}
	if len(plots) > 0 {
		b.WriteString("\n")
	}
	for _, p := range plots {
		rel, err := filepath.Rel(docDir, p.file)
		if err != nil {
			rel = p.file
		}
		fmt.Fprintf(b, "![%s](%s)\n", p.title, filepath.ToSlash(rel))
	}
}
