// Package compose holds compose.yaml, the whole topology in containers. This machine has no
// container runtime to run it, so its test checks the file's structure in Go, the way
// `docker compose config` would, plus what compose cannot know (every part twice, the NATS
// URLs, the NATS config nats-server would read).
package compose

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/conf"
	"go.yaml.in/yaml/v3"
)

type service struct {
	Image       string
	Build       any
	Command     []string
	Environment map[string]string
	DependsOn   map[string]struct{ Condition string } `yaml:"depends_on"`
	Volumes     []string
	EnvFile     []string `yaml:"env_file"`
	Profiles    []string
	Healthcheck struct {
		Test    []string
		Disable bool
	}
}

type file struct {
	Services map[string]service
	Volumes  map[string]any
}

func load(t *testing.T) (file, string) {
	t.Helper()
	b, err := os.ReadFile("compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var f file
	// Anchors and merge keys (<<: *locks) resolve as compose resolves them.
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatalf("compose.yaml: %v", err)
	}
	return f, string(b)
}

var parts = []string{"bridge", "state", "history", "notifier", "watchdog", "api", "alerter"}

func TestComposeTopology(t *testing.T) {
	f, raw := load(t)
	for _, s := range []string{"nats-1", "nats-2", "nats-3", "postgres", "rabbitmq", "clickhouse", "migrate"} {
		if _, ok := f.Services[s]; !ok {
			t.Errorf("no service %s", s)
		}
	}
	for name, s := range f.Services {
		if s.Image == "" && s.Build == nil {
			t.Errorf("%s: neither image nor build", name)
		}
		for dep := range s.DependsOn {
			if _, ok := f.Services[dep]; !ok {
				t.Errorf("%s depends on %s, which is not a service", name, dep)
			}
		}
		for _, v := range s.Volumes {
			src, _, _ := strings.Cut(v, ":")
			if strings.HasPrefix(src, ".") {
				if _, err := os.Stat(src); err != nil {
					t.Errorf("%s mounts %s: %v", name, src, err)
				}
			} else if _, ok := f.Volumes[src]; !ok {
				t.Errorf("%s mounts volume %s, not declared under volumes", name, src)
			}
		}
	}
	// 2 of each part, each listing the three nodes with its own NATS user, after the migration;
	// the partitioned parts split the partitions between their two.
	for _, p := range parts {
		for i, n := range []string{p + "-1", p + "-2"} {
			s, ok := f.Services[n]
			if !ok {
				t.Errorf("no service %s", n)
				continue
			}
			if len(s.Command) < 2 || s.Command[0] != "run" || s.Command[1] != "--targets="+p {
				t.Errorf("%s: command %v", n, s.Command)
			}
			if p != "bridge" && p != "api" && p != "alerter" && !slices.Contains(s.Command, "--partitions="+string(rune('0'+i))+"/2") {
				t.Errorf("%s: command %v does not take its share of the partitions", n, s.Command)
			}
			urls := strings.Split(s.Environment["LOCKS_NATS_URL"], ",")
			if len(urls) != 3 {
				t.Errorf("%s: LOCKS_NATS_URL %q: want the three nodes", n, s.Environment["LOCKS_NATS_URL"])
			}
			for _, u := range urls {
				if !strings.HasPrefix(u, "nats://"+p+":") {
					t.Errorf("%s: NATS URL %q is not the %s user", n, u, p)
				}
			}
			if s.Environment["LOCKS_POSTGRES_URL"] == "" || s.DependsOn["migrate"].Condition != "service_completed_successfully" {
				t.Errorf("%s: not wired to the databases after the migration: %+v", n, s)
			}
		}
	}
	// Every ${VAR} compose requires (${VAR:?…}) is in the example .env, so a copy of it starts.
	ex, err := os.ReadFile("example.env")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile(`\$\{([A-Z_0-9]+)(:\?|\})`).FindAllStringSubmatch(raw, -1) {
		if !regexp.MustCompile(`(?m)^` + m[1] + `=`).Match(ex) {
			t.Errorf("compose.yaml uses ${%s}, which example.env does not set", m[1])
		}
	}
}

// nats.conf and the accounts file the nodes mount parse as nats-server reads them, with the
// passwords of example.env in the environment.
func TestComposeNATSConfig(t *testing.T) {
	f, _ := load(t)
	ex, err := os.ReadFile("example.env")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(ex), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok && !strings.HasPrefix(k, "#") {
			t.Setenv(k, v)
		}
	}
	t.Setenv("NATS_SERVER_NAME", "nats-1")
	// The mounts, laid out as in the container.
	dir := t.TempDir()
	for _, v := range f.Services["nats-1"].Volumes {
		src, dst, _ := strings.Cut(v, ":")
		dst, _, _ = strings.Cut(dst, ":")
		if !strings.HasPrefix(dst, "/etc/nats/") {
			continue
		}
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(dst)), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	m, err := conf.ParseFile(filepath.Join(dir, "nats.conf"))
	if err != nil {
		t.Fatalf("nats.conf: %v", err)
	}
	// The users of deploy/nats/accounts.conf, in its account LOCKS.
	accounts, _ := m["accounts"].(map[string]any)
	locks, _ := accounts["LOCKS"].(map[string]any)
	users, _ := locks["users"].([]any)
	if len(users) < len(parts) {
		t.Fatalf("the accounts file has %d users, want one per part at least: %v", len(users), m["accounts"])
	}
	for _, u := range users {
		um, _ := u.(map[string]any)
		if pw, _ := um["password"].(string); pw == "" {
			t.Errorf("user %v: its password did not resolve to a string from the environment", um["user"])
		}
	}
}
