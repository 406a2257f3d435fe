// Package helm holds the lock-sensors chart (lock-sensors/) and its check: lint and render
// with helm's own Go packages, offline (the NATS dependency is off by default).
package helm

import (
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	"helm.sh/helm/v3/pkg/releaseutil"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/yaml"
)

const chartDir = "lock-sensors"

var parts = []string{"bridge", "state", "history", "notifier", "watchdog", "api", "alerter"}

// rendered is what `helm template` would print, decoded.
type rendered struct {
	deployments []appsv1.Deployment
	pdbs        []policyv1.PodDisruptionBudget
	secrets     []corev1.Secret
	jobs        []batchv1.Job // hooks
}

func render(t *testing.T, vals map[string]any) (rendered, error) {
	t.Helper()
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	// As `helm template`: client-only, nothing sent to a cluster.
	inst := action.NewInstall(&action.Configuration{Log: func(string, ...any) {}})
	inst.DryRun, inst.ClientOnly, inst.Replace = true, true, true
	inst.ReleaseName, inst.Namespace = "locks", "locks"
	rel, err := inst.Run(ch, vals)
	if err != nil {
		return rendered{}, err
	}
	var r rendered
	for _, h := range rel.Hooks {
		var j batchv1.Job
		if err := yaml.UnmarshalStrict([]byte(h.Manifest), &j); err != nil || j.Kind != "Job" {
			t.Fatalf("hook %s is not a valid Job: %v\n%s", h.Name, err, h.Manifest)
		}
		r.jobs = append(r.jobs, j)
	}
	for name, doc := range releaseutil.SplitManifests(rel.Manifest) {
		var head struct{ Kind string }
		if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var err error
		switch head.Kind {
		case "Deployment":
			var d appsv1.Deployment
			err = yaml.UnmarshalStrict([]byte(doc), &d)
			r.deployments = append(r.deployments, d)
		case "PodDisruptionBudget":
			var p policyv1.PodDisruptionBudget
			err = yaml.UnmarshalStrict([]byte(doc), &p)
			r.pdbs = append(r.pdbs, p)
		case "Secret":
			var s corev1.Secret
			err = yaml.UnmarshalStrict([]byte(doc), &s)
			r.secrets = append(r.secrets, s)
		}
		if err != nil {
			t.Fatalf("%s (%s) is not a valid %s: %v\n%s", name, head.Kind, head.Kind, err, doc)
		}
	}
	return r, nil
}

// helm lint: no error and no warning, except that the optional NATS chart is not downloaded.
func TestLint(t *testing.T) {
	l := lint.All(chartDir, nil, "locks", false)
	for _, m := range l.Messages {
		if m.Severity >= support.WarningSev && !strings.Contains(m.Err.Error(), "missing these dependencies: nats") {
			t.Errorf("helm lint: %s", m)
		}
	}
}

// Rendered with the default values: per part its Deployments (the partitioned parts one per
// share, each with its --partitions), probes on /readyz and /healthz, a non-root container,
// its own NATS user on every server, with the password from the chart's Secret, and a PDB
// that selects exactly the part's pods.
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
	// The streams are declared by the migrate Job, as the NATS admin user.
	if len(r.jobs) != 1 || !slices.Equal(r.jobs[0].Spec.Template.Spec.Containers[0].Args, []string{"migrate"}) {
		t.Fatalf("hooks %+v, want one Job running locks migrate", r.jobs)
	}
	jobEnv := map[string]corev1.EnvVar{}
	for _, e := range r.jobs[0].Spec.Template.Spec.Containers[0].Env {
		jobEnv[e.Name] = e
	}
	if u := jobEnv["LOCKS_NATS_URL"].Value; u != "nats://admin:$(NATS_PASSWORD)@nats:4222" ||
		jobEnv["NATS_PASSWORD"].ValueFrom == nil || len(secret.Data[jobEnv["NATS_PASSWORD"].ValueFrom.SecretKeyRef.Key]) == 0 {
		t.Errorf("migrate Job: LOCKS_NATS_URL %q, NATS_PASSWORD %+v: want the admin user from the Secret", u, jobEnv["NATS_PASSWORD"])
	}
	byPart := map[string][]appsv1.Deployment{}
	for _, d := range r.deployments {
		byPart[d.Spec.Template.Labels["app.kubernetes.io/component"]] = append(byPart[d.Spec.Template.Labels["app.kubernetes.io/component"]], d)
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
			if c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz" {
				t.Errorf("%s: readiness probe %+v, want GET /readyz", d.Name, c.ReadinessProbe)
			}
			if c.LivenessProbe == nil || c.LivenessProbe.HTTPGet == nil || c.LivenessProbe.HTTPGet.Path != "/healthz" {
				t.Errorf("%s: liveness probe %+v, want GET /healthz", d.Name, c.LivenessProbe)
			}
			if sc := d.Spec.Template.Spec.SecurityContext; sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
				t.Errorf("%s: pod may run as root", d.Name)
			}
			env := map[string]corev1.EnvVar{}
			var order []string
			for _, e := range c.Env {
				env[e.Name] = e
				order = append(order, e.Name)
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
			if (part == "api") != (env["LOCKS_API_TOKENS"].ValueFrom != nil) {
				t.Errorf("%s: LOCKS_API_TOKENS %+v: only the api gets the tokens", d.Name, env["LOCKS_API_TOKENS"])
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
			if strings.HasSuffix(r.pdbs[i].Name, "-"+part) {
				pdb = &r.pdbs[i]
			}
		}
		if pdb == nil || pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != 1 {
			t.Errorf("%s: PodDisruptionBudget %+v, want maxUnavailable 1", part, pdb)
			continue
		}
		for _, d := range r.deployments {
			if matches(pdb.Spec.Selector.MatchLabels, d.Spec.Template.Labels) != (d.Spec.Template.Labels["app.kubernetes.io/component"] == part) {
				t.Errorf("PDB %s and the pods of %s: selected %v", pdb.Name, d.Name, !(d.Spec.Template.Labels["app.kubernetes.io/component"] == part))
			}
		}
	}
}

func matches(sel, labels map[string]string) bool {
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// With splitPartitions off, one Deployment per part whose pods assign the partitions
// themselves; and no NATS servers is refused instead of every pod running its own NATS.
func TestRenderOptions(t *testing.T) {
	r, err := render(t, map[string]any{"splitPartitions": false, "natsServers": []any{"nats://a:4222", "tls://b:4222"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.deployments) != len(parts) {
		t.Fatalf("%d Deployments, want one per part", len(r.deployments))
	}
	for _, d := range r.deployments {
		c := d.Spec.Template.Spec.Containers[0]
		part := d.Spec.Template.Labels["app.kubernetes.io/component"]
		if *d.Spec.Replicas != 2 || len(c.Args) != 2 {
			t.Errorf("%s: %d replicas, args %v", d.Name, *d.Spec.Replicas, c.Args)
		}
		for _, e := range c.Env {
			if e.Name == "LOCKS_NATS_URL" && e.Value != "nats://"+part+":$(NATS_PASSWORD)@a:4222,tls://"+part+":$(NATS_PASSWORD)@b:4222" {
				t.Errorf("%s: LOCKS_NATS_URL %q", d.Name, e.Value)
			}
		}
	}
	if _, err := render(t, map[string]any{"natsServers": []any{}}); err == nil || !strings.Contains(err.Error(), "natsServers is empty") {
		t.Errorf("no NATS servers: %v", err)
	}
}
