// Command benchreport turns the output of `go test -bench` into the generated part of
// BENCHMARKS.md: the machine, the versions, the command, and every figure beside the baseline
// it is compared with, all from the same run. It rewrites only the lines between the
// `<!-- bench:begin -->` and `<!-- bench:end -->` marker lines, so the text around them stays.
//
//	go run ./cmd/benchreport -in bench.out -out BENCHMARKS.md -cmd "go tool task bench"
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"
)

const begin, end = "<!-- bench:begin -->", "<!-- bench:end -->"

// result is one benchmark line: name and its metrics by unit.
type result struct {
	pkg, name string
	metrics   map[string]float64
	units     []string
}

// baselines pairs a benchmark with the bare-client one it is judged against, and the unit.
var baselines = map[string][][2]string{
	"BenchmarkBridge": {{"BenchmarkBareConsumer/ack=each", "msgs/s"}, {"BenchmarkBareConsumer/ack=multiple", "msgs/s"}},
	// The system's committed rate against what a bare publisher pushes into RabbitMQ here,
	// and against what RabbitMQ alone takes in and hands out to a bare consumer at once.
	"BenchmarkEndToEndIngest": {{"BenchmarkBareRabbitPublisher", "readings/s"}, {"BenchmarkBareRabbitPassThrough", "readings/s"}},
	// Readings/s until the last webhook, against RabbitMQ's own pass-through (issue 17).
	"BenchmarkFullSpeed": {{"BenchmarkBareRabbitPassThrough", "readings/s"}},
	// Each rate's readings/s taken in, against the pass-through the curve measures first (#26).
	"BenchmarkCapacityCurve": {{"BenchmarkCapacityCurve/passthrough", "readings/s"}},
	// Webhooks/s to one client, against a bare HTTP client posting the same bodies.
	"BenchmarkOneClient/notifier": {{"BenchmarkOneClient/baseline", "webhooks/s"}},
}

// baselinesOf is the baselines of name, or of the benchmark it is a sub-benchmark of
// (BenchmarkEndToEndIngest/sync=always is judged against BenchmarkEndToEndIngest's).
func baselinesOf(name string) [][2]string {
	if b, ok := baselines[name]; ok {
		return b
	}
	parent, _, _ := strings.Cut(name, "/")
	return baselines[parent]
}

func main() {
	in := flag.String("in", "bench.out", "go test -bench output")
	out := flag.String("out", "BENCHMARKS.md", "file to update")
	cmdline := flag.String("cmd", "go tool task bench", "command that produced the input")
	seriesDir := flag.String("series", "bench-out", "directory of the benchmarks' time series (CSV)")
	plotDir := flag.String("plots", "docs/bench", "directory to write the PNG plots to")
	flag.Parse()
	f, err := os.Open(*in)
	if err != nil {
		fatal(err)
	}
	results := parse(f)
	f.Close()
	if len(results) == 0 {
		fatal(fmt.Errorf("%s holds no benchmark results", *in))
	}
	plots, err := renderPlots(*seriesDir, *plotDir, results)
	if err != nil {
		fatal(err)
	}
	section := render(results, *cmdline, plots, filepath.Dir(*out))
	old, err := os.ReadFile(*out)
	if err != nil && !os.IsNotExist(err) {
		fatal(err)
	}
	doc, err := splice(string(old), section)
	if err != nil {
		fatal(fmt.Errorf("%s: %w", *out, err))
	}
	if err := os.WriteFile(*out, []byte(doc), 0o644); err != nil {
		fatal(err)
	}
	fmt.Fprintf(os.Stderr, "benchreport: %d results written to %s\n", len(results), *out)
}

// splice puts section between the begin and end marker lines of doc and keeps every byte
// before the begin line and from the end line on. A marker counts only as a line of its own,
// so prose that names the markers is left alone. An empty doc gets a heading and the markers;
// a doc that lacks them is refused rather than guessed at.
func splice(doc, section string) (string, error) {
	if doc == "" {
		doc = "# Benchmarks\n\n" + begin + "\n" + end + "\n"
	}
	i := markerLine(doc, begin, 0)
	if i < 0 {
		return "", fmt.Errorf("no line %s: put it and %s where the generated table goes", begin, end)
	}
	i += len(begin)
	if i < len(doc) {
		i++ // the begin line's newline
	}
	j := markerLine(doc, end, i)
	if j < 0 {
		return "", fmt.Errorf("no line %s after %s", end, begin)
	}
	if section != "" && !strings.HasSuffix(section, "\n") {
		section += "\n"
	}
	return doc[:i] + section + doc[j:], nil
}

// markerLine is the offset of the first line of doc, at or after from (a line start), that
// is exactly marker, or -1.
func markerLine(doc, marker string, from int) int {
	for k := from; k < len(doc); {
		line, _, ok := strings.Cut(doc[k:], "\n")
		if line == marker {
			return k
		}
		if !ok {
			return -1
		}
		k += len(line) + 1
	}
	return -1
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "benchreport:", err)
	os.Exit(1)
}

func parse(r io.Reader) []result {
	var res []result
	pkg := ""
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		if p, ok := strings.CutPrefix(line, "pkg: "); ok {
			pkg = strings.TrimPrefix(p, "github.com/lock-sensors/lock-sensors/")
			continue
		}
		if !strings.HasPrefix(line, "Benchmark") {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) < 4 {
			continue
		}
		name := fields[0]
		if k := strings.LastIndex(name, "-"); k > 0 {
			name = name[:k] // drop -GOMAXPROCS
		}
		r := result{pkg: pkg, name: name, metrics: map[string]float64{}}
		for k := 2; k+1 < len(fields); k += 2 {
			v, err := strconv.ParseFloat(fields[k], 64)
			if err != nil {
				continue
			}
			r.metrics[fields[k+1]] = v
			r.units = append(r.units, fields[k+1])
		}
		res = append(res, r)
	}
	return res
}

func sh(name string, args ...string) string {
	b, err := exec.Command(name, args...).Output()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(b))
}

func machine() []string {
	cpu := "unknown"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "model name"); ok {
				cpu = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	mem := "unknown"
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		if f := strings.Fields(strings.SplitN(string(b), "\n", 2)[0]); len(f) >= 2 {
			kb, _ := strconv.ParseFloat(f[1], 64)
			mem = fmt.Sprintf("%.1f GiB", kb/1024/1024)
		}
	}
	return []string{
		fmt.Sprintf("- date: %s", time.Now().UTC().Format(time.RFC3339)),
		fmt.Sprintf("- machine: %d cores (%s), %s memory, %s", runtime.NumCPU(), cpu, mem, sh("uname", "-sr")),
		fmt.Sprintf("- OS: %s", sh("sh", "-c", ". /etc/os-release && echo $PRETTY_NAME")),
		fmt.Sprintf("- Go: %s", runtime.Version()),
		fmt.Sprintf("- PostgreSQL: %s", sh("sh", "-c", "psql -V | cut -d' ' -f3")),
		fmt.Sprintf("- RabbitMQ: %s", sh("sh", "-c", "dpkg-query -W -f='${Version}' rabbitmq-server")),
		fmt.Sprintf("- ClickHouse: %s", sh("sh", "-c", "dpkg-query -W -f='${Version}' clickhouse-server")),
		fmt.Sprintf("- NATS: nats-server %s (embedded; its own process, built from the same module, in the e2e soak and scaling runs)", sh("sh", "-c", "go list -m -f '{{.Version}}' github.com/nats-io/nats-server/v2")),
		"- every server and the load run on this one machine, on loopback",
	}
}

func render(rs []result, cmdline string, plots []plotFile, docDir string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Generated by `%s` (the figures below are from one run).\n\n", cmdline)
	for _, l := range machine() {
		b.WriteString(l + "\n")
	}
	byName := map[string]result{}
	for _, r := range rs {
		byName[r.name] = r
	}
	b.WriteString("\n| package | benchmark | figures | baseline (same run) | ratio |\n| --- | --- | --- | --- | --- |\n")
	sort.SliceStable(rs, func(i, j int) bool { return rs[i].pkg < rs[j].pkg })
	for _, r := range rs {
		var figs []string
		for _, u := range r.units {
			if u == "ns/op" || u == "B/op" || u == "allocs/op" || strings.HasSuffix(u, cpuSuffix) {
				continue
			}
			figs = append(figs, fmt.Sprintf("%s %s", human(r.metrics[u]), u))
		}
		if len(figs) == 0 {
			figs = append(figs, fmt.Sprintf("%s ns/op", human(r.metrics["ns/op"])))
		}
		var base, ratio []string
		for _, pair := range baselinesOf(r.name) {
			br, ok := byName[pair[0]]
			if !ok {
				continue
			}
			bv, v := br.metrics[pair[1]], r.metrics[pair[1]]
			if bv == 0 {
				bv = br.metrics["msgs/s"]
			}
			base = append(base, fmt.Sprintf("%s: %s %s", strings.TrimPrefix(pair[0], "Benchmark"), human(bv), pair[1]))
			if bv > 0 {
				ratio = append(ratio, fmt.Sprintf("%.2f", v/bv))
			}
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", r.pkg, r.name, strings.Join(figs, ", "),
			strings.Join(base, "; "), strings.Join(ratio, "; "))
	}
	renderSoak(&b, rs, plots, docDir)
	renderScaling(&b, rs)
	renderCPU(&b, rs)
	renderWatchdogMemory(&b, rs)
	return b.String()
}

func human(v float64) string {
	switch {
	case v >= 100:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case v >= 1:
		return strconv.FormatFloat(v, 'f', 1, 64)
	default:
		return strconv.FormatFloat(v, 'g', 3, 64)
	}
}
