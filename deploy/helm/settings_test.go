package helm

import (
	"os"
	"os/exec"
	"path"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// settings are the variables `locks run` knows, as its --help names them (env LOCKS_…).
func settings(t *testing.T) []string {
	t.Helper()
	// -trimpath as the main module's tests build: the compiled packages they left in the
	// cache serve this build too, wherever the checkout is.
	cmd := exec.Command("go", "run", "-trimpath", "./cmd/locks", "run", "--help")
	cmd.Dir = "../.."
	out, _ := cmd.CombinedOutput() // --help exits 0 or 2 by flag package convention
	var keys []string
	for _, m := range regexp.MustCompile(`\(env (LOCKS_[A-Z0-9_]+),`).FindAllStringSubmatch(string(out), -1) {
		keys = append(keys, m[1])
	}
	if len(keys) < 20 {
		t.Fatalf("locks run --help named %d settings:\n%s", len(keys), out)
	}
	slices.Sort(keys)
	return slices.Compact(keys)
}

type chartValues struct {
	Config  map[string]any
	Secrets map[string]any
}

func values(t *testing.T) chartValues {
	t.Helper()
	b, err := os.ReadFile(chartDir + "/values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var v chartValues
	if err := yaml.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	return v
}

// Every setting of the binary has its place in the chart: under config (any part, and the
// migration), in the Secret, or set by the chart itself on every part; and config names
// nothing the binary does not know. A setting added to internal/config without a place here
// fails this test.
func TestEverySettingHasAPlace(t *testing.T) {
	keys := settings(t)
	v := values(t)
	r, err := render(t, nil, "secrets.alertSMTPURL=smtp://a:b@mail:587", "secrets.alertWebhookURL=https://ops.example.com/x", "secrets.alertWebhookSecret=whsec_AAAA")
	if err != nil {
		t.Fatal(err)
	}
	placed := map[string]string{}
	for k := range v.Config {
		placed[k] = "values config"
		if !slices.Contains(keys, k) {
			t.Errorf("values.yaml config sets %s, which locks run does not know", k)
		}
	}
	for _, d := range r.deployments {
		for _, e := range d.Spec.Template.Spec.Containers[0].Env {
			if _, ok := placed[e.Name]; !ok {
				placed[e.Name] = "set by the chart on " + d.Name
			}
		}
	}
	for _, s := range r.secrets {
		for k := range s.Data {
			placed[k] = "the Secret"
		}
	}
	for _, k := range keys {
		if _, ok := placed[k]; !ok {
			t.Errorf("%s has no place in the chart (values.yaml config, the Secret, or a Deployment's env)", k)
		}
	}

	// A config value reaches every part and the migration; an empty one is not set.
	r, err = render(t, nil, "config.LOCKS_LOST_AFTER=5m")
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range r.deployments {
		var got []string
		for _, e := range d.Spec.Template.Spec.Containers[0].Env {
			if e.Name == "LOCKS_LOST_AFTER" {
				got = append(got, e.Value)
			}
			if e.Value == "" && e.ValueFrom == nil {
				t.Errorf("%s: %s set empty (an empty value is not the default: the binary refuses it)", d.Name, e.Name)
			}
		}
		if !slices.Equal(got, []string{"5m"}) {
			t.Errorf("%s: LOCKS_LOST_AFTER %v, want [5m]", d.Name, got)
		}
	}
}

// nats-values.yaml, the official NATS chart's values: a cluster of 3 with JetStream syncing
// every write, and the accounts file this chart ships (deploy/nats/accounts.conf, unchanged)
// mounted where the include points, each user's password from this chart's Secret.
func TestNATSValues(t *testing.T) {
	b, err := os.ReadFile("nats-values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	type patch struct {
		Op, Path string
		Value    map[string]any
	}
	var nv struct {
		FullnameOverride string `json:"fullnameOverride"`
		Config           struct {
			Cluster struct {
				Enabled  bool
				Replicas int
			}
			Jetstream struct {
				Enabled bool
				Merge   map[string]any
			}
			Merge map[string]any
		}
		Container struct {
			Env map[string]struct {
				ValueFrom struct {
					SecretKeyRef struct{ Name, Key string } `json:"secretKeyRef"`
				} `json:"valueFrom"`
			}
			Patch []patch
		}
		PodTemplate struct{ Patch []patch } `json:"podTemplate"`
	}
	if err := yaml.Unmarshal(b, &nv); err != nil {
		t.Fatalf("nats-values.yaml: %v", err)
	}
	if !nv.Config.Cluster.Enabled || nv.Config.Cluster.Replicas != 3 || !nv.Config.Jetstream.Enabled {
		t.Errorf("cluster %+v, jetstream %v: want a JetStream cluster of 3", nv.Config.Cluster, nv.Config.Jetstream.Enabled)
	}
	if s := nv.Config.Jetstream.Merge["sync_interval"]; s != "always" {
		t.Errorf("jetstream sync_interval %v, want always", s)
	}

	r, err := render(t, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The service the parts connect to by default.
	if nv.FullnameOverride != "nats" {
		t.Errorf("fullnameOverride %q: the parts' default natsServers is nats://nats:4222", nv.FullnameOverride)
	}
	// The accounts: this chart's ConfigMap, mounted where the include resolves.
	accounts, err := os.ReadFile("../nats/accounts.conf")
	if err != nil {
		t.Fatal(err)
	}
	if len(r.configMaps) != 1 || r.configMaps[0].Data["accounts.conf"] != string(accounts) {
		t.Fatalf("the chart's ConfigMaps %d: want one holding deploy/nats/accounts.conf unchanged", len(r.configMaps))
	}
	var volume, mount string
	for _, p := range nv.PodTemplate.Patch {
		if cm, ok := p.Value["configMap"].(map[string]any); ok && p.Op == "add" && p.Path == "/spec/volumes/-" {
			volume = p.Value["name"].(string)
			if cm["name"] != r.configMaps[0].Name {
				t.Errorf("volume %s mounts ConfigMap %v, the chart renders %s", volume, cm["name"], r.configMaps[0].Name)
			}
		}
	}
	for _, p := range nv.Container.Patch {
		if p.Op == "add" && p.Path == "/volumeMounts/-" && p.Value["name"] == volume {
			mount, _ = p.Value["mountPath"].(string)
		}
	}
	inc, _ := nv.Config.Merge["$include"].(string)
	// The NATS chart writes its config to /etc/nats-config/nats.conf; includes are relative to it.
	if volume == "" || mount == "" || path.Join("/etc/nats-config", inc) != path.Join(mount, "accounts.conf") {
		t.Errorf("include %q, volume %q mounted at %q: the include does not reach accounts.conf", inc, volume, mount)
	}
	// Every password the accounts file reads comes from this chart's Secret, under its user.
	secret := r.secrets[0]
	vars := regexp.MustCompile(`\{user: (\w+), password: \$(\w+)`).FindAllStringSubmatch(string(accounts), -1)
	if len(vars) < len(parts)+1 {
		t.Fatalf("accounts.conf has %d users with passwords from the environment", len(vars))
	}
	for _, m := range vars {
		user, env := m[1], m[2]
		ref := nv.Container.Env[env].ValueFrom.SecretKeyRef
		if ref.Name != secret.Name || ref.Key != "nats-password-"+user || len(secret.Data[ref.Key]) == 0 {
			t.Errorf("%s (user %s): from %+v, want the Secret %s key nats-password-%s", env, user, ref, secret.Name, user)
		}
	}
	if !strings.Contains(string(b), secret.Name) {
		t.Errorf("nats-values.yaml does not name the Secret %s", secret.Name)
	}
}
