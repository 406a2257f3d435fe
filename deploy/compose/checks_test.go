package compose

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// Every service that keeps running says whether it is healthy; the migration, which exits
// when done, is the one without (the parts wait for it to succeed).
func TestComposeHealthchecks(t *testing.T) {
	f, _ := load(t)
	for name, s := range f.Services {
		if name == "migrate" {
			if !s.Healthcheck.Disable {
				t.Errorf("migrate: a one-shot service with a healthcheck")
			}
			continue
		}
		if len(s.Healthcheck.Test) < 2 || s.Healthcheck.Disable {
			t.Errorf("%s: healthcheck %+v", name, s.Healthcheck)
		}
	}
	// The locks image has no shell or curl: its healthcheck is the binary's own.
	if got := f.Services["api-1"].Healthcheck.Test; !slices.Equal(got, []string{"CMD", "/usr/local/bin/locks", "healthcheck"}) {
		t.Errorf("api-1: healthcheck %v", got)
	}
}

// settings are `locks run --help`'s variables and their defaults.
func settings(t *testing.T) map[string]string {
	t.Helper()
	out, _ := exec.Command(testenv.Build(t, "./cmd/locks"), "run", "--help").CombinedOutput()
	known := map[string]string{}
	for _, m := range regexp.MustCompile(`\(env (LOCKS_[A-Z0-9_]+), default "([^"]*)"`).FindAllStringSubmatch(string(out), -1) {
		known[m[1]] = m[2]
	}
	if len(known) < 20 {
		t.Fatalf("locks run --help named %d settings:\n%s", len(known), out)
	}
	return known
}

// Every setting of the binary has its place in the parts' environment, and one compose fills
// from .env (${LOCKS_X:-default}) has the binary's own default, so an unset variable changes
// nothing.
func TestComposeEverySetting(t *testing.T) {
	f, _ := load(t)
	known := settings(t)
	placed := map[string]bool{}
	for name, s := range f.Services {
		for k, v := range s.Environment {
			if !strings.HasPrefix(k, "LOCKS_") {
				continue
			}
			placed[k] = true
			def, ok := known[k]
			if !ok {
				t.Errorf("%s sets %s, which locks run does not know", name, k)
			}
			if m := regexp.MustCompile(`^\$\{` + k + `:-(.*)\}$`).FindStringSubmatch(v); m != nil && m[1] != def &&
				!(k == "LOCKS_NATS_REPLICAS" && m[1] == "3") { // the cluster of 3 below
				t.Errorf("%s: %s defaults to %q, the binary to %q", name, k, m[1], def)
			}
		}
	}
	for k := range known {
		if !placed[k] {
			t.Errorf("%s has no place in compose.yaml", k)
		}
	}
}

// --profile monitoring: Prometheus with the rules and a job "locks" over every part's
// containers, Grafana with the dashboard and Prometheus provisioned; neither starts without
// the profile.
func TestComposeMonitoring(t *testing.T) {
	f, _ := load(t)
	mounts := func(s service) map[string]string {
		m := map[string]string{}
		for _, v := range s.Volumes {
			src, dst, _ := strings.Cut(v, ":")
			dst, _, _ = strings.Cut(dst, ":")
			m[dst] = src
		}
		return m
	}
	prom, graf, jaeger := f.Services["prometheus"], f.Services["grafana"], f.Services["jaeger"]
	for name, s := range map[string]service{"prometheus": prom, "grafana": graf, "jaeger": jaeger} {
		if !slices.Equal(s.Profiles, []string{"monitoring"}) {
			t.Errorf("%s: profiles %v, want [monitoring]", name, s.Profiles)
		}
	}
	// Jaeger runs the configuration the tests run (deploy/jaeger/config.yaml), its OTLP
	// ports inside the network.
	if jm := mounts(jaeger); jm["/etc/jaeger/config.yaml"] != "../jaeger/config.yaml" || !slices.Contains(jaeger.Command, "/etc/jaeger/config.yaml") {
		t.Errorf("jaeger mounts %v, command %v: not deploy/jaeger/config.yaml", jm, jaeger.Command)
	}
	pm := mounts(prom)
	b, err := os.ReadFile(pm["/etc/prometheus/prometheus.yml"])
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		RuleFiles     []string `yaml:"rule_files"`
		ScrapeConfigs []struct {
			JobName       string                       `yaml:"job_name"`
			StaticConfigs []struct{ Targets []string } `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	if err := yaml.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}
	for _, r := range cfg.RuleFiles {
		if pm[r] != "../prometheus/alerts.yml" {
			t.Errorf("rule file %s is %q, want deploy/prometheus/alerts.yml", r, pm[r])
		}
	}
	if len(cfg.RuleFiles) == 0 {
		t.Error("no rule files")
	}
	var targets []string
	for _, sc := range cfg.ScrapeConfigs {
		if sc.JobName == "locks" {
			for _, s := range sc.StaticConfigs {
				targets = append(targets, s.Targets...)
			}
		}
	}
	var want []string
	for name, s := range f.Services {
		if len(s.Command) > 0 && s.Command[0] == "run" {
			want = append(want, name+":8080")
		}
	}
	slices.Sort(targets)
	slices.Sort(want)
	if !slices.Equal(targets, want) {
		t.Errorf("job locks scrapes %v, want every part's container %v", targets, want)
	}
	gm := mounts(graf)
	if gm["/var/lib/grafana/dashboards/locks.json"] != "../grafana/locks.json" {
		t.Errorf("grafana mounts %v: no deploy/grafana/locks.json", gm)
	}
	for _, dir := range []string{"/etc/grafana/provisioning/datasources/", "/etc/grafana/provisioning/dashboards/"} {
		found := false
		for dst, src := range gm {
			if strings.HasPrefix(dst, dir) {
				found = true
				b, err := os.ReadFile(src)
				if err != nil {
					t.Fatal(err)
				}
				if strings.Contains(dir, "datasources") && !strings.Contains(string(b), "http://prometheus:9090") {
					t.Errorf("%s: not the Prometheus service", src)
				}
				if strings.Contains(dir, "dashboards") && !strings.Contains(string(b), "/var/lib/grafana/dashboards") {
					t.Errorf("%s: not the dashboards' directory", src)
				}
			}
		}
		if !found {
			t.Errorf("grafana provisions nothing under %s", dir)
		}
	}
	// promtool (Debian's prometheus package) reads the config and the rules as Prometheus would.
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool is not installed: apt-get install prometheus (deploy/local/services.sh does)")
	}
	dir := t.TempDir()
	conf := strings.ReplaceAll(string(b), "/etc/prometheus/", dir+"/")
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	rules, err := os.ReadFile("../prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "alerts.yml"), rules, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(promtool, "check", "config", filepath.Join(dir, "prometheus.yml")).CombinedOutput(); err != nil {
		t.Errorf("promtool check config: %v\n%s", err, out)
	}
}

// docker-compose (Debian's package; no daemon needed) validates the file against the compose
// schema and resolves it with a copy of example.env as .env, with and without the monitoring
// profile. Debian's docker-compose 1.29 predates the top-level name, which is left out of
// its copy; the files the services mount are copied beside it as they are laid out here.
func TestComposeConfigValidates(t *testing.T) {
	dc, err := exec.LookPath("docker-compose")
	if err != nil {
		t.Fatal("docker-compose is not installed: apt-get install docker-compose (deploy/local/services.sh does)")
	}
	root := t.TempDir()
	for _, d := range []string{"compose", "nats", "prometheus", "grafana", "container"} {
		if err := os.CopyFS(filepath.Join(root, "deploy", d), os.DirFS(filepath.Join("..", d))); err != nil {
			t.Fatal(err)
		}
	}
	dir := filepath.Join(root, "deploy", "compose")
	b, err := os.ReadFile("compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	b = regexp.MustCompile(`(?m)^name: .*\n`).ReplaceAll(b, nil)
	if err := os.WriteFile(filepath.Join(dir, "compose.yaml"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	ex, err := os.ReadFile("example.env")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, ".env"), ex, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, profile := range [][]string{nil, {"--profile", "monitoring"}} {
		args := append(append([]string{"-f", "compose.yaml"}, profile...), "config", "--services")
		cmd := exec.Command(dc, args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "COMPOSE_PROJECT_NAME=lock-sensors")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("docker-compose %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		// docker-compose 1.29 lists every service whatever the profile; which ones a profile
		// starts is TestComposeMonitoring's.
		if services := strings.Fields(string(out)); !slices.Contains(services, "api-1") || !slices.Contains(services, "grafana") {
			t.Errorf("docker-compose %v: services %v", profile, services)
		}
	}
}
