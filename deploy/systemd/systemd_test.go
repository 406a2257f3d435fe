// Package systemd holds the units that run lock-sensors on VMs (locks@.service, one
// instance per part, after locks-migrate.service) and the example of the environment file
// they read.
package systemd

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// unit reads a unit file into section → key → values.
func unit(t *testing.T, path string) map[string]map[string][]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	u := map[string]map[string][]string{}
	section := ""
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			section = line[1 : len(line)-1]
			u[section] = map[string][]string{}
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || section == "" {
				t.Fatalf("%s:%d: %q is neither a section nor key=value in one", path, n, line)
			}
			u[section][k] = append(u[section][k], v)
		}
	}
	return u
}

// The hardening every unit carries: what `systemd-analyze security` flagged besides the
// network a service of this kind needs.
var hardening = map[string]string{
	"NoNewPrivileges":         "yes",
	"ProtectSystem":           "strict",
	"ProtectHome":             "yes",
	"PrivateTmp":              "yes",
	"PrivateDevices":          "yes",
	"ProtectKernelTunables":   "yes",
	"ProtectKernelModules":    "yes",
	"ProtectKernelLogs":       "yes",
	"ProtectControlGroups":    "yes",
	"ProtectClock":            "yes",
	"ProtectHostname":         "yes",
	"RestrictNamespaces":      "yes",
	"RestrictSUIDSGID":        "yes",
	"RestrictRealtime":        "yes",
	"LockPersonality":         "yes",
	"MemoryDenyWriteExecute":  "yes",
	"SystemCallArchitectures": "native",
	"UMask":                   "0077",
	"CapabilityBoundingSet":   "",
}

func checkHardening(t *testing.T, name string, svc map[string][]string) {
	t.Helper()
	for k, v := range hardening {
		if got := svc[k]; len(got) != 1 || got[0] != v {
			t.Errorf("%s: %s=%v, want %q", name, k, got, v)
		}
	}
	if f := svc["SystemCallFilter"]; len(f) == 0 || f[0] != "@system-service" {
		t.Errorf("%s: SystemCallFilter=%v, want @system-service first", name, f)
	}
}

func checkValues(t *testing.T, name string, svc map[string][]string, want map[string]string) {
	t.Helper()
	for k, v := range want {
		if got := svc[k]; len(got) != 1 || got[0] != v {
			t.Errorf("%s: %s=%v, want %s", name, k, got, v)
		}
	}
}

// The template runs one part per instance, as a non-root user, as a Type=notify service
// (started once locks run says READY=1) after the migration unit it requires, restarted on
// failure but not on a configuration error (exit 2), with the shared and the part's
// environment files and the hardening.
func TestUnitStructure(t *testing.T) {
	u := unit(t, "locks@.service")
	svc := u["Service"]
	if svc == nil || u["Unit"] == nil || u["Install"] == nil {
		t.Fatalf("sections %v: want Unit, Service and Install", u)
	}
	checkValues(t, "locks@.service", svc, map[string]string{
		"Type":                     "notify",
		"NotifyAccess":             "main",
		"ExecStart":                "/usr/local/bin/locks run --targets=%i",
		"User":                     "locks",
		"Restart":                  "on-failure",
		"RestartPreventExitStatus": "2",
		"KillSignal":               "SIGTERM",
	})
	envs := strings.Join(svc["EnvironmentFile"], " ")
	if !strings.Contains(envs, "/etc/locks/locks.env") || !strings.Contains(envs, "-/etc/locks/%i.env") {
		t.Errorf("EnvironmentFile=%v: want the shared file and the part's optional one", svc["EnvironmentFile"])
	}
	for _, k := range []string{"Requires", "After"} {
		if !strings.Contains(strings.Join(u["Unit"][k], " "), "locks-migrate.service") {
			t.Errorf("%s=%v: the parts must start after the migration", k, u["Unit"][k])
		}
	}
	checkHardening(t, "locks@.service", svc)

	m := unit(t, "locks-migrate.service")
	checkValues(t, "locks-migrate.service", m["Service"], map[string]string{
		"Type":            "oneshot",
		"RemainAfterExit": "yes",
		"ExecStart":       "/usr/local/bin/locks migrate",
		"User":            "locks",
	})
	if envs := strings.Join(m["Service"]["EnvironmentFile"], " "); !strings.Contains(envs, "/etc/locks/locks.env") || !strings.Contains(envs, "-/etc/locks/migrate.env") {
		t.Errorf("locks-migrate.service: EnvironmentFile=%v", m["Service"]["EnvironmentFile"])
	}
	checkHardening(t, "locks-migrate.service", m["Service"])
}

// locks.env.example names every setting `locks run` knows (set or commented out), and
// nothing else.
func TestEnvExampleHasEverySetting(t *testing.T) {
	help, err := exec.Command(testenv.Build(t, "./cmd/locks"), "run", "--help").CombinedOutput()
	if err != nil && !strings.Contains(string(help), "Usage") {
		t.Fatalf("locks run --help: %v: %s", err, help)
	}
	known := map[string]bool{}
	for _, m := range regexp.MustCompile(`\(env (LOCKS_[A-Z0-9_]+),`).FindAllStringSubmatch(string(help), -1) {
		known[m[1]] = true
	}
	if len(known) < 20 {
		t.Fatalf("locks run --help named %d settings:\n%s", len(known), help)
	}
	ex, err := os.ReadFile("locks.env.example")
	if err != nil {
		t.Fatal(err)
	}
	placed := map[string]bool{}
	for _, line := range strings.Split(string(ex), "\n") {
		line = strings.TrimPrefix(strings.TrimSpace(line), "#")
		k, _, ok := strings.Cut(line, "=")
		if !ok || !strings.HasPrefix(k, "LOCKS_") {
			continue
		}
		placed[k] = true
		if !known[k] {
			t.Errorf("locks.env.example sets %s, which locks run does not know", k)
		}
	}
	for k := range known {
		if !placed[k] {
			t.Errorf("%s has no line in locks.env.example", k)
		}
	}
}

// systemd's own checks, where systemd-analyze is installed (Debian: the systemd package):
// instances of both units verify together without a single warning (systemd-analyze exits 0
// on unknown keys and bad values, so any output fails), and `systemd-analyze security`
// rates each OK with none of the hardening above flagged. Only ExecStart's binary is swapped
// for one that exists here.
func TestUnitVerifies(t *testing.T) {
	sa, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Fatal("systemd-analyze is not installed: apt-get install systemd")
	}
	dir := t.TempDir()
	for src, dst := range map[string]string{"locks@.service": "locks@state.service", "locks-migrate.service": "locks-migrate.service"} {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, dst), []byte(strings.ReplaceAll(string(b), "/usr/local/bin/locks ", "/bin/true ")), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(sa, "verify", "locks@state.service", "locks-migrate.service")
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
	for _, name := range []string{"locks@state.service", "locks-migrate.service"} {
		cmd := exec.Command(sa, "security", "--offline=yes", "--no-pager", name)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("systemd-analyze security %s: %v\n%s", name, err, out)
		}
		m := regexp.MustCompile(`Overall exposure level for \S+: ([0-9.]+) (\S+)`).FindStringSubmatch(string(out))
		if m == nil || m[2] != "OK" {
			t.Errorf("%s: exposure %v, want OK:\n%s", name, m, out)
		}
		for _, line := range strings.Split(string(out), "\n") {
			for k := range hardening {
				if strings.HasPrefix(line, "✗ "+k+"=") {
					t.Errorf("%s: systemd-analyze security flags %s", name, strings.TrimSpace(line))
				}
			}
			for _, k := range []string{"SystemCallFilter=", "SystemCallArchitectures=", "RestrictSUIDSGID="} {
				if strings.HasPrefix(line, "✗ "+k) {
					t.Errorf("%s: systemd-analyze security flags %s", name, strings.TrimSpace(line))
				}
			}
		}
	}
}
