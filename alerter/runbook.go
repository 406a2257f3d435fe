package alerter

import "github.com/lock-sensors/lock-sensors/internal/runbook"

// RunbookBase is docs/runbook.md as operators read it. Every alert kind (RunbookURL) and
// every Prometheus rule of deploy/prometheus/alerts.yml (its runbook_url annotation) links
// to a section of it; docs/runbook_test.go fails when one has none.
const RunbookBase = runbook.Base

// Kinds are the alert kinds the alerter can raise.
func Kinds() []string {
	var kinds []string
	for _, d := range (&Alerter{}).allDetectors() {
		kinds = append(kinds, d.kind)
	}
	return kinds
}

// RunbookURL is the runbook section of kind: what it means, how to confirm it, what to do
// and how to know it is over. The section's heading is the kind itself.
func RunbookURL(kind string) string { return runbook.URL(kind) }
