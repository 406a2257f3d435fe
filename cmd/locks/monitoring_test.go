package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/prometheus/promql/parser"
	"go.yaml.in/yaml/v3"

	"github.com/lock-sensors/lock-sensors/internal/config"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/ops"
	"github.com/lock-sensors/lock-sensors/internal/partition"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

const (
	alertsFile    = "../../deploy/prometheus/alerts.yml"
	dashboardFile = "../../deploy/grafana/locks.json"
)

// prometheusSeries are series Prometheus itself makes for every scrape target.
var prometheusSeries = []string{"up"}

// The Prometheus rules pass promtool, and every expression of the rules and of the Grafana
// dashboard parses and names only metrics a `locks run --targets=all` process registers
// (gathered from the parts' registrations, so a renamed metric fails here).
func TestPrometheusRulesAndGrafanaDashboard(t *testing.T) {
	t.Parallel()
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool is missing: install Debian's prometheus package (bash deploy/local/services.sh does)")
	}
	if out, err := exec.Command(promtool, "check", "rules", alertsFile).CombinedOutput(); err != nil {
		t.Fatalf("promtool check rules %s: %v\n%s", alertsFile, err, out)
	}

	known := registeredMetrics(t)
	exprs := map[string]string{} // where → PromQL
	var rules struct {
		Groups []struct {
			Name  string
			Rules []struct {
				Alert, Record, Expr string
			}
		}
	}
	readYAML(t, alertsFile, &rules)
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			exprs["rule "+r.Alert+r.Record] = r.Expr
		}
	}
	if len(exprs) < 10 {
		t.Fatalf("%s holds %d rules; did its layout change?", alertsFile, len(exprs))
	}
	for where, e := range dashboardExprs(t) {
		exprs[where] = e
	}
	p := parser.NewParser(parser.Options{})
	for where, e := range exprs {
		expr, err := p.ParseExpr(grafanaVars.Replace(e))
		if err != nil {
			t.Errorf("%s: %q does not parse: %v", where, e, err)
			continue
		}
		parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
			if vs, ok := n.(*parser.VectorSelector); ok && !known(vs.Name) {
				t.Errorf("%s: metric %s is not one the system registers", where, vs.Name)
			}
			return nil
		})
	}
}

// grafanaVars are the dashboard's variables in PromQL, replaced by values of their kind.
var grafanaVars = strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$__range", "1h")

// dashboardExprs checks the dashboard's shape (what Grafana needs to import it) and returns
// its PromQL by panel.
func dashboardExprs(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	type panel struct {
		ID      *int   `json:"id"`
		Type    string `json:"type"`
		Title   string `json:"title"`
		GridPos *struct {
			W, H int
		} `json:"gridPos"`
		Targets []struct {
			RefID string `json:"refId"`
			Expr  string `json:"expr"`
		} `json:"targets"`
		Panels []json.RawMessage `json:"panels"`
	}
	var d struct {
		Title         string  `json:"title"`
		UID           string  `json:"uid"`
		SchemaVersion int     `json:"schemaVersion"`
		Panels        []panel `json:"panels"`
		Templating    struct {
			List []struct {
				Name, Type, Query string
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s is not valid JSON: %v", dashboardFile, err)
	}
	if d.Title == "" || d.UID == "" || d.SchemaVersion < 30 || len(d.Panels) == 0 {
		t.Fatalf("%s lacks title, uid, schemaVersion ≥ 30 or panels", dashboardFile)
	}
	if !slices.ContainsFunc(d.Templating.List, func(v struct{ Name, Type, Query string }) bool {
		return v.Name == "datasource" && v.Type == "datasource" && v.Query == "prometheus"
	}) {
		t.Errorf("%s has no Prometheus datasource variable named datasource", dashboardFile)
	}
	ids := map[int]string{}
	exprs := map[string]string{}
	for _, p := range d.Panels {
		switch {
		case p.ID == nil:
			t.Errorf("panel %q has no id", p.Title)
			continue
		case ids[*p.ID] != "":
			t.Errorf("panels %q and %q share id %d", ids[*p.ID], p.Title, *p.ID)
		case p.Title == "" || p.Type == "" || p.GridPos == nil || p.GridPos.W < 1 || p.GridPos.H < 1:
			t.Errorf("panel %d lacks a title, type or gridPos", *p.ID)
		case len(p.Panels) > 0:
			t.Errorf("row %q nests panels; keep rows expanded so every panel is checked", p.Title)
		case p.Type != "row" && len(p.Targets) == 0:
			t.Errorf("panel %q has no query", p.Title)
		}
		ids[*p.ID] = p.Title
		refs := map[string]bool{}
		for _, q := range p.Targets {
			if q.Expr == "" || q.RefID == "" || refs[q.RefID] {
				t.Errorf("panel %q: a query without expr, or with a missing or repeated refId", p.Title)
			}
			refs[q.RefID] = true
			exprs["panel "+p.Title+" "+q.RefID] = q.Expr
		}
	}
	return exprs
}

// registeredMetrics builds every part as `locks run --targets=all` does, on real servers, and
// returns whether a series name belongs to a registered metric (a histogram's or summary's
// _bucket, _sum and _count included).
func registeredMetrics(t *testing.T) func(string) bool {
	t.Helper()
	reg := prometheus.NewRegistry()
	srv := ops.New("127.0.0.1:0", reg, testenv.Logger(t))
	rec := &recordingRegisterer{Registerer: reg, names: map[string]bool{}}
	// The process's own collectors, as runParts registers them.
	rec.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		srv.Readiness(ops.ReadinessReuseDefault))
	cfg := config.Default()
	cfg.Partitions = 2
	all, err := partition.Parse("all", cfg.Partitions)
	if err != nil {
		t.Fatal(err)
	}
	ns := testenv.NATS(t)
	_, pg := testenv.Postgres(t)
	_, ch := testenv.ClickHouse(t)
	d := deps{cfg: cfg, log: testenv.Logger(t), nc: ns.NC, js: ns.JS, pg: pg, notifierPG: pg, ch: ch, reg: rec, ops: srv, partitions: all, auto: true}
	if err := declareStreams(t.Context(), ns.JS, cfg, ns.URL, natsx.Declare); err != nil {
		t.Fatal(err)
	}
	for _, name := range allTargets {
		if _, err := buildPart(name, d); err != nil {
			t.Fatalf("build %s: %v", name, err)
		}
	}
	for _, s := range prometheusSeries {
		rec.names[s] = true
	}
	if len(rec.names) < 40 {
		t.Fatalf("only %d metric names registered: %v", len(rec.names), rec.names)
	}
	return func(name string) bool {
		if rec.names[name] {
			return true
		}
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if base, ok := strings.CutSuffix(name, suffix); ok && rec.names[base] {
				return true
			}
		}
		return false
	}
}

// recordingRegisterer notes the name of every metric a collector describes, including vectors
// that have no series yet (which /metrics would not show).
type recordingRegisterer struct {
	prometheus.Registerer
	names map[string]bool
}

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

func (r *recordingRegisterer) Register(c prometheus.Collector) error {
	ch := make(chan *prometheus.Desc)
	go func() { c.Describe(ch); close(ch) }()
	for d := range ch {
		if m := fqName.FindStringSubmatch(d.String()); m != nil {
			r.names[m[1]] = true
		}
	}
	return r.Registerer.Register(c)
}

func (r *recordingRegisterer) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}
