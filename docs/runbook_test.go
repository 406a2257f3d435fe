package docs_test

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/lock-sensors/lock-sensors/alerter"
	"github.com/lock-sensors/lock-sensors/internal/runbook"
)

var (
	section    = regexp.MustCompile(`(?m)^### (.*)$`)
	bold       = regexp.MustCompile(`\*\*[^*]*\*\*`)
	italic     = regexp.MustCompile(`\*([^*]+)\*`)
	space      = regexp.MustCompile(`\s+`)
	uiSection  = regexp.MustCompile(`<h2>([^<]+)</h2>`)
	protoKinds = regexp.MustCompile(`(?s)message Alert \{.*?((?:\s*//[^\n]*)+)\s*string kind = `)
	backquoted = regexp.MustCompile("`([a-z_]+)`")
	runbookKey = []string{"**Means:**", "**Confirm:**", "**Do:**", "**Over when:**"}
)

// runbookSections are the ### sections of runbook.md by anchor, each with its text.
func runbookSections(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile("runbook.md")
	if err != nil {
		t.Fatal(err)
	}
	text := fence.ReplaceAllString(string(b), "")
	out := map[string]string{}
	idx := section.FindAllStringSubmatchIndex(text, -1)
	for i, m := range idx {
		end := len(text)
		if i+1 < len(idx) {
			end = idx[i+1][0]
		}
		if next := strings.Index(text[m[1]:end], "\n## "); next >= 0 {
			end = m[1] + next
		}
		out[slug(text[m[2]:m[3]])] = text[m[1]:end]
	}
	return out
}

// Every Prometheus rule and every alert kind of the alerter has its section of runbook.md,
// saying what it means, how to confirm it, what to do and when it is over; each rule's
// runbook_url and each kind's RunbookURL point at it; no section is left for an alert that
// no longer exists; and every panel a section names is a panel of the Grafana dashboard or
// of the /ui/ dashboard.
func TestRunbookCoversEveryAlert(t *testing.T) {
	t.Parallel()
	sections := runbookSections(t)
	if !strings.HasSuffix(alerter.RunbookBase, "/docs/runbook.md") {
		t.Errorf("alerter.RunbookBase %q is not docs/runbook.md", alerter.RunbookBase)
	}
	covered := map[string]bool{}
	need := func(what, anchor, url string) {
		t.Helper()
		body, ok := sections[anchor]
		if !ok {
			t.Errorf("%s has no section in docs/runbook.md (a heading \"### %s\")", what, anchor)
			return
		}
		covered[anchor] = true
		if want := alerter.RunbookBase + "#" + anchor; url != want {
			t.Errorf("%s: runbook URL %q, want %q", what, url, want)
		}
		for _, k := range runbookKey {
			if !strings.Contains(body, k) {
				t.Errorf("the runbook section of %s lacks %s", what, k)
			}
		}
	}

	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert       string
				Annotations map[string]string
			}
		}
	}
	b, err := os.ReadFile("../deploy/prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &rules); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue // a recording rule
			}
			n++
			need("rule "+r.Alert, slug(r.Alert), r.Annotations["runbook_url"])
		}
	}
	if n < 10 {
		t.Fatalf("alerts.yml holds %d alert rules; did its layout change?", n)
	}
	kinds := alerter.Kinds()
	if len(kinds) < 5 {
		t.Fatalf("alerter.Kinds() = %v", kinds)
	}
	for _, k := range kinds {
		need("alert kind "+k, slug(k), alerter.RunbookURL(k))
	}
	// The API's Alert documents its kinds (and serves runbook.URL of each): every kind it
	// names is one the alerter raises, with its section, and the other way round.
	proto, err := os.ReadFile("../proto/locks/v1/alerts.proto")
	if err != nil {
		t.Fatal(err)
	}
	m := protoKinds.FindSubmatch(proto)
	if m == nil {
		t.Fatal("alerts.proto: no comment listing the kinds above Alert.kind; did its layout change?")
	}
	documented := map[string]bool{}
	for _, k := range backquoted.FindAllSubmatch(m[1], -1) {
		documented[string(k[1])] = true
		need("the API's alert kind "+string(k[1]), slug(string(k[1])), runbook.URL(string(k[1])))
	}
	for _, k := range kinds {
		if !documented[k] {
			t.Errorf("alert kind %s is missing from Alert.kind's comment in proto/locks/v1/alerts.proto", k)
		}
	}
	for anchor := range sections {
		if !covered[anchor] {
			t.Errorf("docs/runbook.md has a section %q that no rule or alert kind links to", anchor)
		}
	}

	panels := grafanaPanels(t)
	ui, err := os.ReadFile("../ui/templates/dashboard.html")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range uiSection.FindAllStringSubmatch(string(ui), -1) {
		panels[m[1]] = true
	}
	for anchor, body := range sections {
		for _, m := range italic.FindAllStringSubmatch(bold.ReplaceAllString(body, ""), -1) {
			if name := space.ReplaceAllString(m[1], " "); !panels[name] {
				t.Errorf("section %s names a panel *%s* that neither dashboard has", anchor, name)
			}
		}
	}
}

// grafanaPanels are the titles of the Grafana dashboard's panels, rows included.
func grafanaPanels(t *testing.T) map[string]bool {
	t.Helper()
	b, err := os.ReadFile("../deploy/grafana/locks.json")
	if err != nil {
		t.Fatal(err)
	}
	type panel struct {
		Title  string  `json:"title"`
		Panels []panel `json:"panels"`
	}
	var d struct {
		Panels []panel `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			out[p.Title] = true
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	if len(out) < 10 {
		t.Fatalf("locks.json has %d panels; did its layout change?", len(out))
	}
	return out
}
