package api

import (
	"net/http"
	"testing"

	"github.com/lock-sensors/lock-sensors/internal/runbook"
)

// GET /v1/alerts lists the alerter's alerts newest first with their notices, filters by
// state and kind, and pages.
func TestListAlerts(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := t.Context()
	for _, a := range []struct {
		kind, subject string
		resolved      bool
	}{
		{"dead_letter", "client/c1", true},
		{"endpoint_disabled", "client/c2", false},
		{"mass_loss", "sensors", false},
	} {
		var id int64
		if err := e.db.QueryRow(ctx, `INSERT INTO alerts (kind, subject, summary, details, resolved_at)
			VALUES ($1, $2, 'summary of ' || $2, '{"n": 3}', CASE WHEN $3 THEN now() END) RETURNING id`, a.kind, a.subject, a.resolved).Scan(&id); err != nil {
			t.Fatal(err)
		}
		if _, err := e.db.Exec(ctx, `INSERT INTO alert_notices (alert_id, event, channel, sent_at, attempts) VALUES ($1, 'firing', 'email', now(), 1),
			($1, 'firing', 'webhook', NULL, 2)`, id); err != nil {
			t.Fatal(err)
		}
	}
	r := e.want(e.do("GET", "/v1/alerts", nil), http.StatusOK)
	alerts, _ := r.body["alerts"].([]any)
	if len(alerts) != 3 {
		t.Fatalf("alerts %s, want 3", r.raw)
	}
	first := alerts[0].(map[string]any)
	if first["kind"] != "mass_loss" || first["state"] != "ALERT_STATE_FIRING" || first["fired_time"] == nil || first["resolved_time"] != nil {
		t.Errorf("newest alert %v", first)
	}
	if first["runbook_url"] != runbook.URL("mass_loss") {
		t.Errorf("runbook_url %v, want the kind's section %s", first["runbook_url"], runbook.URL("mass_loss"))
	}
	if d, _ := first["details"].(map[string]any); d["n"] != float64(3) {
		t.Errorf("details %v, want n 3", first["details"])
	}
	if ns, _ := first["notices"].([]any); len(ns) != 2 || ns[0].(map[string]any)["sent_time"] == nil || ns[1].(map[string]any)["sent_time"] != nil {
		t.Errorf("notices %v, want the e-mail sent and the webhook waiting", first["notices"])
	}
	r = e.want(e.do("GET", "/v1/alerts?state=ALERT_STATE_RESOLVED", nil), http.StatusOK)
	if alerts, _ := r.body["alerts"].([]any); len(alerts) != 1 || alerts[0].(map[string]any)["subject"] != "client/c1" {
		t.Errorf("resolved alerts %s, want client/c1", r.raw)
	}
	r = e.want(e.do("GET", "/v1/alerts?state=ALERT_STATE_FIRING&kind=endpoint_disabled", nil), http.StatusOK)
	if alerts, _ := r.body["alerts"].([]any); len(alerts) != 1 || alerts[0].(map[string]any)["subject"] != "client/c2" {
		t.Errorf("firing endpoint_disabled alerts %s, want client/c2", r.raw)
	}
	// Pages of 2: the newest two, then the last.
	r = e.want(e.do("GET", "/v1/alerts?page_size=2", nil), http.StatusOK)
	tok := r.str("next_page_token")
	if alerts, _ := r.body["alerts"].([]any); len(alerts) != 2 || tok == "" {
		t.Fatalf("first page %s", r.raw)
	}
	r = e.want(e.do("GET", "/v1/alerts?page_size=2&page_token="+tok, nil), http.StatusOK)
	if alerts, _ := r.body["alerts"].([]any); len(alerts) != 1 || alerts[0].(map[string]any)["subject"] != "client/c1" || r.str("next_page_token") != "" {
		t.Errorf("second page %s", r.raw)
	}
	// A token of another filter is refused.
	if r := e.do("GET", "/v1/alerts?page_size=2&state=ALERT_STATE_FIRING&page_token="+tok, nil); r.status != http.StatusBadRequest {
		t.Errorf("token of another filter: status %d, want 400", r.status)
	}
	if r := e.do("GET", "/v1/alerts", nil, "Authorization", ""); r.status != http.StatusUnauthorized {
		t.Errorf("without a token: status %d, want 401", r.status)
	}
}
