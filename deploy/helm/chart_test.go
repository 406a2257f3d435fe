// Package helm holds the lock-sensors chart (lock-sensors/), the values of the official NATS
// chart it runs on (nats-values.yaml), and their check: the stock helm CLI (a go tool of this
// module, built from the module cache, offline) lints the chart and renders it with the
// default and the scaled values, and the tests below read what it rendered.
package helm

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/yaml"
)

const chartDir = "lock-sensors"

var parts = []string{"bridge", "state", "history", "notifier", "watchdog", "api", "alerter"}

// The values files CI renders: the defaults and the scaled deployment.
var valuesFiles = map[string][]string{
	"defaults": nil,
	"scaled":   {filepath.Join(chartDir, "values-scaled.yaml")},
}

// helm runs the stock CLI pinned in go.mod (`tool helm.sh/helm/v3/cmd/helm`).
func helm(t *testing.T, args ...string) (stdout string, err error) {
	t.Helper()
	cmd := exec.Command("go", append([]string{"tool", "helm"}, args...)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	cmd.Env = append(os.Environ(), "HELM_CONFIG_HOME="+t.TempDir(), "HELM_CACHE_HOME="+t.TempDir(), "HELM_DATA_HOME="+t.TempDir())
	if err := cmd.Run(); err != nil {
		return out.String(), &cmdError{err: err, stderr: errb.String()}
	}
	return out.String(), nil
}

type cmdError struct {
	err    error
	stderr string
}

func (e *cmdError) Error() string { return e.err.Error() + ": " + e.stderr }

// helm lint --strict: no error and no warning, with either values file.
func TestLint(t *testing.T) {
	for name, files := range valuesFiles {
		t.Run(name, func(t *testing.T) {
			args := []string{"lint", "--strict", chartDir}
			for _, f := range files {
				args = append(args, "-f", f)
			}
			if out, err := helm(t, args...); err != nil {
				t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
			}
		})
	}
}

// object is one rendered document: its kind, name, hook annotations and the document.
type object struct {
	Kind     string
	Metadata struct {
		Name        string
		Labels      map[string]string
		Annotations map[string]string
	}
	doc []byte
}

func (o object) hook() (phases []string, weight int, ok bool) {
	h, ok := o.Metadata.Annotations["helm.sh/hook"]
	if !ok {
		return nil, 0, false
	}
	weight, _ = strconv.Atoi(o.Metadata.Annotations["helm.sh/hook-weight"])
	return strings.Split(h, ","), weight, true
}

// rendered is what `helm template` printed, decoded (hooks included).
type rendered struct {
	objects     []object
	deployments []appsv1.Deployment
	pdbs        []policyv1.PodDisruptionBudget
	secrets     []corev1.Secret
	configMaps  []corev1.ConfigMap
	services    []corev1.Service
	policies    []networkingv1.NetworkPolicy
	jobs        []batchv1.Job
}

func (r rendered) find(kind, name string) (object, bool) {
	for _, o := range r.objects {
		if o.Kind == kind && o.Metadata.Name == name {
			return o, true
		}
	}
	return object{}, false
}

var renderCache sync.Map

// render runs helm template as release "locks" in namespace "locks" with the values files and
// --set flags given; every document must decode strictly into its Kubernetes type.
func render(t *testing.T, files []string, set ...string) (rendered, error) {
	t.Helper()
	args := []string{"template", "locks", chartDir, "--namespace", "locks"}
	for _, f := range files {
		args = append(args, "-f", f)
	}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	key := strings.Join(args, "\x00")
	if r, ok := renderCache.Load(key); ok {
		return r.(rendered), nil
	}
	out, err := helm(t, args...)
	if err != nil {
		return rendered{}, err
	}
	var r rendered
	for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(out, -1) {
		if strings.TrimSpace(regexp.MustCompile(`(?m)^#.*$`).ReplaceAllString(doc, "")) == "" {
			continue
		}
		var o object
		if err := yaml.Unmarshal([]byte(doc), &o); err != nil {
			t.Fatalf("not YAML: %v\n%s", err, doc)
		}
		o.doc = []byte(doc)
		r.objects = append(r.objects, o)
		strict := func(v any) {
			t.Helper()
			if err := yaml.UnmarshalStrict([]byte(doc), v); err != nil {
				t.Fatalf("%s %s is not a valid %s: %v\n%s", o.Kind, o.Metadata.Name, o.Kind, err, doc)
			}
		}
		switch o.Kind {
		case "Deployment":
			var d appsv1.Deployment
			strict(&d)
			r.deployments = append(r.deployments, d)
		case "PodDisruptionBudget":
			var p policyv1.PodDisruptionBudget
			strict(&p)
			r.pdbs = append(r.pdbs, p)
		case "Secret":
			var s corev1.Secret
			strict(&s)
			r.secrets = append(r.secrets, s)
		case "ConfigMap":
			var c corev1.ConfigMap
			strict(&c)
			r.configMaps = append(r.configMaps, c)
		case "Service":
			var s corev1.Service
			strict(&s)
			r.services = append(r.services, s)
		case "NetworkPolicy":
			var p networkingv1.NetworkPolicy
			strict(&p)
			r.policies = append(r.policies, p)
		case "Job":
			var j batchv1.Job
			strict(&j)
			r.jobs = append(r.jobs, j)
		case "ServiceAccount", "ServiceMonitor", "PodMonitor":
		default:
			t.Errorf("unexpected kind %s (%s)", o.Kind, o.Metadata.Name)
		}
	}
	renderCache.Store(key, r)
	return r, nil
}

func component(labels map[string]string) string { return labels["app.kubernetes.io/component"] }

// Every Deployment of either values file: probes on /healthz and /readyz, CPU and memory
// requests and limits, a pod that cannot run as root and a container that cannot gain
// privileges or write its image; each part's pods and shares as values say.
func TestRenderedDeployments(t *testing.T) {
	for name, files := range valuesFiles {
		t.Run(name, func(t *testing.T) {
			r, err := render(t, files)
			if err != nil {
				t.Fatal(err)
			}
			if len(r.deployments) == 0 {
				t.Fatal("no Deployment rendered")
			}
			for _, d := range r.deployments {
				spec := d.Spec.Template.Spec
				if len(spec.Containers) != 1 {
					t.Errorf("%s: %d containers", d.Name, len(spec.Containers))
					continue
				}
				c := spec.Containers[0]
				if p := c.ReadinessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/readyz" {
					t.Errorf("%s: readiness probe %+v, want GET /readyz", d.Name, p)
				}
				if p := c.LivenessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/healthz" {
					t.Errorf("%s: liveness probe %+v, want GET /healthz", d.Name, p)
				}
				for _, res := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
					req, lim := c.Resources.Requests[res], c.Resources.Limits[res]
					if req.IsZero() || lim.IsZero() || lim.Cmp(req) < 0 {
						t.Errorf("%s: %s request %s, limit %s: want both, limit ≥ request", d.Name, res, req.String(), lim.String())
					}
				}
				if sc := spec.SecurityContext; sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.RunAsUser == nil || *sc.RunAsUser == 0 {
					t.Errorf("%s: pod security context %+v may run as root", d.Name, spec.SecurityContext)
				}
				if sc := c.SecurityContext; sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
					sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") {
					t.Errorf("%s: container security context %+v", d.Name, c.SecurityContext)
				}
				if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
					t.Errorf("%s: mounts a Kubernetes API token it never uses", d.Name)
				}
			}
		})
	}
}

// The migration runs before any part, at install and at upgrade: a pre-install,pre-upgrade
// hook (a post-install one waits for parts that wait for it under --wait), and whatever it
// reads (the Secret, its ServiceAccount, its NetworkPolicy) and what NATS needs before it can
// serve it (the accounts) are hooks of lower weight, so they exist when it starts.
func TestHookOrder(t *testing.T) {
	for name, files := range valuesFiles {
		t.Run(name, func(t *testing.T) {
			r, err := render(t, files)
			if err != nil {
				t.Fatal(err)
			}
			if len(r.jobs) != 1 || !slices.Equal(r.jobs[0].Spec.Template.Spec.Containers[0].Args, []string{"migrate"}) {
				t.Fatalf("%d Jobs, want one running locks migrate", len(r.jobs))
			}
			job := r.jobs[0]
			jo, _ := r.find("Job", job.Name)
			phases, jobWeight, ok := jo.hook()
			slices.Sort(phases)
			if !ok || !slices.Equal(phases, []string{"pre-install", "pre-upgrade"}) {
				t.Fatalf("migrate Job hook %v, want pre-install,pre-upgrade", phases)
			}
			before := func(kind, name string) {
				t.Helper()
				o, found := r.find(kind, name)
				if !found {
					return // not rendered by this chart (an existing Secret): the operator's
				}
				ph, w, ok := o.hook()
				slices.Sort(ph)
				if !ok || !slices.Equal(ph, []string{"pre-install", "pre-upgrade"}) || w >= jobWeight {
					t.Errorf("%s %s: hook %v weight %d; want pre-install,pre-upgrade with a weight below the migration's %d", kind, name, ph, w, jobWeight)
				}
			}
			spec := job.Spec.Template.Spec
			if spec.ServiceAccountName != "" {
				before("ServiceAccount", spec.ServiceAccountName)
			}
			for _, e := range spec.Containers[0].Env {
				if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
					before("Secret", e.ValueFrom.SecretKeyRef.Name)
				}
			}
			for _, p := range r.policies {
				if component(p.Spec.PodSelector.MatchLabels) == "migrate" {
					before("NetworkPolicy", p.Name)
				}
			}
			for _, c := range r.configMaps {
				before("ConfigMap", c.Name)
			}
			if sc := spec.SecurityContext; sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
				t.Errorf("migrate Job may run as root")
			}
			if res := spec.Containers[0].Resources; res.Limits.Memory().IsZero() {
				t.Errorf("migrate Job: no memory limit")
			}
			// Nothing else is a hook: the parts are ordinary resources that start after it.
			for _, o := range r.objects {
				if _, _, hook := o.hook(); hook && !slices.Contains([]string{"Job", "Secret", "ConfigMap", "ServiceAccount", "NetworkPolicy"}, o.Kind) {
					t.Errorf("%s %s is a hook", o.Kind, o.Metadata.Name)
				}
			}
		})
	}
}

// Rendered with the default values: per part its Deployments (the partitioned parts one per
// share, each with its --partitions), its own NATS user with the password from the chart's
// Secret, only the URLs it uses, a PDB and a metrics Service that select exactly its pods.
func TestRenderDefaults(t *testing.T) {
	r, err := render(t, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.secrets) != 1 {
		t.Fatalf("%d Secrets, want 1", len(r.secrets))
	}
	secret := r.secrets[0]
	for _, k := range []string{"LOCKS_API_TOKENS", "LOCKS_POSTGRES_URL", "LOCKS_CLICKHOUSE_URL", "LOCKS_AMQP_URL"} {
		if len(secret.Data[k]) == 0 {
			t.Errorf("Secret has no %s", k)
		}
	}
	jobEnv := map[string]corev1.EnvVar{}
	for _, e := range r.jobs[0].Spec.Template.Spec.Containers[0].Env {
		jobEnv[e.Name] = e
	}
	if u := jobEnv["LOCKS_NATS_URL"].Value; u != "nats://admin:$(NATS_PASSWORD)@nats:4222" ||
		jobEnv["NATS_PASSWORD"].ValueFrom == nil || len(secret.Data[jobEnv["NATS_PASSWORD"].ValueFrom.SecretKeyRef.Key]) == 0 {
		t.Errorf("migrate Job: LOCKS_NATS_URL %q, NATS_PASSWORD %+v: want the admin user from the Secret", u, jobEnv["NATS_PASSWORD"])
	}
	// What each part reads (cmd/locks/run.go: needsPostgres, needsClickHouse, needsAMQP).
	uses := map[string][]string{
		"bridge":   {"LOCKS_POSTGRES_URL", "LOCKS_AMQP_URL"},
		"state":    {"LOCKS_POSTGRES_URL"},
		"history":  {"LOCKS_POSTGRES_URL", "LOCKS_CLICKHOUSE_URL"},
		"notifier": {"LOCKS_POSTGRES_URL"},
		"watchdog": {"LOCKS_POSTGRES_URL", "LOCKS_AMQP_URL"},
		"api":      {"LOCKS_POSTGRES_URL", "LOCKS_CLICKHOUSE_URL", "LOCKS_API_TOKENS"},
		"alerter":  {"LOCKS_POSTGRES_URL", "LOCKS_CLICKHOUSE_URL", "LOCKS_ALERT_SMTP_URL", "LOCKS_ALERT_WEBHOOK_URL", "LOCKS_ALERT_WEBHOOK_SECRET"},
	}
	byPart := map[string][]appsv1.Deployment{}
	for _, d := range r.deployments {
		byPart[component(d.Spec.Template.Labels)] = append(byPart[component(d.Spec.Template.Labels)], d)
	}
	for _, part := range parts {
		ds := byPart[part]
		pods, shares := 0, []string{}
		for _, d := range ds {
			pods += int(*d.Spec.Replicas)
			c := d.Spec.Template.Spec.Containers[0]
			if !slices.Contains(c.Args, "--targets="+part) {
				t.Errorf("%s: args %v", d.Name, c.Args)
			}
			for _, a := range c.Args {
				if s, ok := strings.CutPrefix(a, "--partitions="); ok {
					shares = append(shares, s)
				}
			}
			env := map[string]corev1.EnvVar{}
			var order, secrets []string
			for _, e := range c.Env {
				env[e.Name] = e
				order = append(order, e.Name)
				if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil && e.Name != "NATS_PASSWORD" {
					secrets = append(secrets, e.Name)
				}
			}
			pw := env["NATS_PASSWORD"].ValueFrom
			if pw == nil || pw.SecretKeyRef == nil || pw.SecretKeyRef.Name != secret.Name || len(secret.Data[pw.SecretKeyRef.Key]) == 0 {
				t.Errorf("%s: NATS_PASSWORD %+v does not come from the chart's Secret", d.Name, env["NATS_PASSWORD"])
			}
			// Kubernetes expands $(NATS_PASSWORD) only from a variable defined before.
			if u := env["LOCKS_NATS_URL"].Value; u != "nats://"+part+":$(NATS_PASSWORD)@nats:4222" ||
				slices.Index(order, "NATS_PASSWORD") > slices.Index(order, "LOCKS_NATS_URL") {
				t.Errorf("%s: LOCKS_NATS_URL %q (env order %v)", d.Name, u, order)
			}
			if env["LOCKS_NATS_DECLARE"].Value != "false" {
				t.Errorf("%s: LOCKS_NATS_DECLARE %+v, want false (its NATS user may not declare)", d.Name, env["LOCKS_NATS_DECLARE"])
			}
			if want := slices.Sorted(slices.Values(uses[part])); !slices.Equal(slices.Sorted(slices.Values(secrets)), want) {
				t.Errorf("%s: secrets %v, want exactly %v", d.Name, secrets, want)
			}
		}
		if pods != 2 {
			t.Errorf("%s: %d pods over %d Deployments, want 2", part, pods, len(ds))
		}
		if part == "bridge" || part == "api" || part == "alerter" {
			if len(ds) != 1 || len(shares) != 0 {
				t.Errorf("%s: %d Deployments with partitions %v, want 1 without", part, len(ds), shares)
			}
		} else if slices.Sort(shares); !slices.Equal(shares, []string{"0/2", "1/2"}) {
			t.Errorf("%s: shares %v, want 0/2 and 1/2", part, shares)
		}

		var pdb *policyv1.PodDisruptionBudget
		for i := range r.pdbs {
			if component(r.pdbs[i].Labels) == part {
				pdb = &r.pdbs[i]
			}
		}
		if pdb == nil || pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != 1 {
			t.Errorf("%s: PodDisruptionBudget %+v, want maxUnavailable 1", part, pdb)
			continue
		}
		var metrics *corev1.Service
		for i, s := range r.services {
			if s.Labels["lock-sensors.io/metrics"] == "true" && component(s.Labels) == part {
				metrics = &r.services[i]
			}
		}
		if metrics == nil || metrics.Annotations["prometheus.io/scrape"] != "true" || len(metrics.Spec.Ports) != 1 || metrics.Spec.Ports[0].TargetPort.String() != "http" {
			t.Errorf("%s: metrics Service %+v", part, metrics)
			continue
		}
		for _, d := range r.deployments {
			mine := component(d.Spec.Template.Labels) == part
			if matches(pdb.Spec.Selector.MatchLabels, d.Spec.Template.Labels) != mine {
				t.Errorf("PDB %s and the pods of %s: selected %v", pdb.Name, d.Name, !mine)
			}
			if matches(metrics.Spec.Selector, d.Spec.Template.Labels) != mine {
				t.Errorf("Service %s and the pods of %s: selected %v", metrics.Name, d.Name, !mine)
			}
		}
	}
	// Options that are off by default render nothing.
	for _, o := range r.objects {
		if o.Kind == "NetworkPolicy" || o.Kind == "ServiceMonitor" || o.Kind == "PodMonitor" {
			t.Errorf("%s %s rendered by default", o.Kind, o.Metadata.Name)
		}
	}
}

func matches(sel, labels map[string]string) bool {
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return len(sel) > 0
}

// With the scaled values: five shares of each partitioned part, a ServiceMonitor over the
// metrics Services, and a NetworkPolicy per part (and the migration) that lets it reach DNS,
// NATS and only the servers it uses, with only the api's ports open to clients.
func TestRenderScaled(t *testing.T) {
	r, err := render(t, valuesFiles["scaled"])
	if err != nil {
		t.Fatal(err)
	}
	if len(r.secrets) != 0 {
		t.Errorf("%d Secrets rendered with secrets.existingSecret", len(r.secrets))
	}
	shares := map[string]int{}
	for _, d := range r.deployments {
		shares[component(d.Spec.Template.Labels)]++
		for _, e := range d.Spec.Template.Spec.Containers[0].Env {
			if e.Name == "LOCKS_PARTITIONS" && e.Value != "32" {
				t.Errorf("%s: LOCKS_PARTITIONS %s", d.Name, e.Value)
			}
		}
	}
	for _, p := range []string{"state", "history", "notifier", "watchdog"} {
		if shares[p] != 5 {
			t.Errorf("%s: %d Deployments, want 5 shares", p, shares[p])
		}
	}
	if _, ok := r.find("ServiceMonitor", "locks-lock-sensors"); !ok {
		t.Error("no ServiceMonitor")
	}
	// Ports each part may reach besides DNS (53) and NATS (4222), from values-scaled.yaml;
	// "any" is the webhooks' rule without ports.
	reach := map[string][]string{
		"bridge":   {"5432", "5671"},
		"state":    {"5432"},
		"history":  {"5432", "9000"},
		"notifier": {"5432", "any"},
		"watchdog": {"5432", "5671"},
		"api":      {"5432", "9000"},
		"alerter":  {"5432", "9000", "any"},
		"migrate":  {"5432", "9000"},
	}
	seen := map[string]bool{}
	for _, p := range r.policies {
		part := component(p.Spec.PodSelector.MatchLabels)
		seen[part] = true
		if !slices.Contains(p.Spec.PolicyTypes, networkingv1.PolicyTypeEgress) || !slices.Contains(p.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) {
			t.Errorf("%s: policy types %v", p.Name, p.Spec.PolicyTypes)
		}
		var got []string
		for _, e := range p.Spec.Egress {
			if len(e.Ports) == 0 {
				got = append(got, "any")
			}
			for _, port := range e.Ports {
				if s := port.Port.String(); s != "53" && s != "4222" {
					got = append(got, s)
				}
			}
		}
		slices.Sort(got)
		got = slices.Compact(got)
		if !slices.Equal(got, reach[part]) {
			t.Errorf("%s may reach %v, want %v", p.Name, got, reach[part])
		}
		var open []string
		for _, in := range p.Spec.Ingress {
			if len(in.From) == 0 {
				t.Errorf("%s: ingress %+v open to anyone although values name who may come", p.Name, in)
			}
			for _, port := range in.Ports {
				open = append(open, port.Port.String())
			}
		}
		if slices.Contains(open, "grpc") != (part == "api") {
			t.Errorf("%s: ingress ports %v", p.Name, open)
		}
	}
	for part := range reach {
		if !seen[part] {
			t.Errorf("no NetworkPolicy for %s", part)
		}
	}
}

// With splitPartitions off, one Deployment per part whose pods assign the partitions
// themselves; and no NATS servers is refused instead of every pod running its own NATS.
func TestRenderOptions(t *testing.T) {
	r, err := render(t, nil, "splitPartitions=false", "natsServers={nats://a:4222,tls://b:4222}")
	if err != nil {
		t.Fatal(err)
	}
	if len(r.deployments) != len(parts) {
		t.Fatalf("%d Deployments, want one per part", len(r.deployments))
	}
	for _, d := range r.deployments {
		c := d.Spec.Template.Spec.Containers[0]
		part := component(d.Spec.Template.Labels)
		if *d.Spec.Replicas != 2 || len(c.Args) != 2 {
			t.Errorf("%s: %d replicas, args %v", d.Name, *d.Spec.Replicas, c.Args)
		}
		for _, e := range c.Env {
			if e.Name == "LOCKS_NATS_URL" && e.Value != "nats://"+part+":$(NATS_PASSWORD)@a:4222,tls://"+part+":$(NATS_PASSWORD)@b:4222" {
				t.Errorf("%s: LOCKS_NATS_URL %q", d.Name, e.Value)
			}
		}
	}
	if _, err := render(t, nil, "natsServers=null"); err == nil || !strings.Contains(err.Error(), "natsServers is empty") {
		t.Errorf("no NATS servers: %v", err)
	}
}
