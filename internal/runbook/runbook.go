// Package runbook names the sections of docs/runbook.md that alerts link to: the alerter's
// notices and the API's Alert carry the same URL per kind, and every Prometheus rule of
// deploy/prometheus/alerts.yml its runbook_url annotation (docs/runbook_test.go checks that
// each has its section).
package runbook

// Base is docs/runbook.md as operators read it.
const Base = "https://github.com/lock-sensors/lock-sensors/blob/main/docs/runbook.md"

// URL is the runbook section whose heading is anchor (an alert kind, or a rule's name as
// GitHub turns it into an anchor).
func URL(anchor string) string { return Base + "#" + anchor }
