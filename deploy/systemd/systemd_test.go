// Package systemd holds the units that run lock-sensors' parts on VMs (locks@.service, one
// instance per part) and the example of the environment file they read.
package systemd

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
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

// The template runs one part per instance, as a non-root user, restarted on failure but not
// on a configuration error (exit 2), with the shared and the part's environment files.
func TestUnitStructure(t *testing.T) {
	u := unit(t, "locks@.service")
	svc := u["Service"]
	if svc == nil || u["Unit"] == nil || u["Install"] == nil {
		t.Fatalf("sections %v: want Unit, Service and Install", u)
	}
	want := map[string]string{
		"ExecStart":                "/usr/local/bin/locks run --targets=%i",
		"User":                     "locks",
		"Restart":                  "on-failure",
		"RestartPreventExitStatus": "2",
		"KillSignal":               "SIGTERM",
	}
	for k, v := range want {
		if got := svc[k]; len(got) != 1 || got[0] != v {
			t.Errorf("%s=%v, want %s", k, got, v)
		}
	}
	envs := strings.Join(svc["EnvironmentFile"], " ")
	if !strings.Contains(envs, "/etc/locks/locks.env") || !strings.Contains(envs, "-/etc/locks/%i.env") {
		t.Errorf("EnvironmentFile=%v: want the shared file and the part's optional one", svc["EnvironmentFile"])
	}
	// Every variable of the example is one the binary knows.
	help, err := exec.Command("go", "run", "../../cmd/locks", "run", "--help").CombinedOutput()
	if err != nil && !strings.Contains(string(help), "Usage") {
		t.Fatalf("locks run --help: %v: %s", err, help)
	}
	ex, err := os.ReadFile("locks.env.example")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(ex), "\n") {
		line = strings.TrimPrefix(strings.TrimSpace(line), "#")
		k, _, ok := strings.Cut(line, "=")
		if !ok || !strings.HasPrefix(k, "LOCKS_") {
			continue
		}
		if !strings.Contains(string(help), "(env "+k+",") {
			t.Errorf("locks.env.example sets %s, which locks run does not know", k)
		}
	}
}

// systemd's own check, where systemd-analyze is installed: an instance of the template must
// verify without a single warning (systemd-analyze exits 0 on unknown keys and bad values, so
// any output fails). Only ExecStart's binary is swapped for one that exists here.
func TestUnitVerifies(t *testing.T) {
	sa, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Log("systemd-analyze is not installed; TestUnitStructure checks the unit (apt-get install systemd)")
		return
	}
	b, err := os.ReadFile("locks@.service")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	inst := filepath.Join(dir, "locks@state.service")
	if err := os.WriteFile(inst, []byte(strings.ReplaceAll(string(b), "/usr/local/bin/locks ", "/bin/true ")), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(sa, "verify", inst).CombinedOutput()
	if err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
}
