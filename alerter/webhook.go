package alerter

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/mail"
	"net/url"
	"strconv"
	"time"

	"github.com/lock-sensors/lock-sensors/internal/redact"
	"github.com/lock-sensors/lock-sensors/internal/whsign"
)

// mailAddress is the bare address of "Name <addr>" or "addr".
func mailAddress(s string) (string, error) {
	a, err := mail.ParseAddress(s)
	if err != nil {
		return s, err
	}
	return a.Address, nil
}

// WebhookBody is the JSON the operator webhook receives.
type WebhookBody struct {
	// ID is the notice's id, equal to the webhook-id header.
	ID string `json:"id"`
	// Type is alert.firing or alert.resolved.
	Type       string       `json:"type"`
	OccurredAt time.Time    `json:"occurred_at"`
	Alert      WebhookAlert `json:"alert"`
}

// WebhookAlert is the alert of a WebhookBody.
type WebhookAlert struct {
	ID         int64           `json:"id"`
	Kind       string          `json:"kind"`
	Subject    string          `json:"subject"`
	Summary    string          `json:"summary"`
	Details    json.RawMessage `json:"details"`
	FiredAt    time.Time       `json:"fired_at"`
	ResolvedAt *time.Time      `json:"resolved_at"`
	// RunbookURL is the kind's section of docs/runbook.md.
	RunbookURL string `json:"runbook_url"`
}

// sendWebhook posts notice n to the operator webhook, signed like client webhooks
// (docs/contract.md section 2); nil only on a 2xx.
func (a *Alerter) sendWebhook(ctx context.Context, n notice) error {
	occurred := n.firedAt
	if n.event == eventResolved && n.resolvedAt != nil {
		occurred = *n.resolvedAt
	}
	body, err := json.Marshal(WebhookBody{ID: n.noticeID(), Type: "alert." + n.event, OccurredAt: occurred.UTC(),
		Alert: WebhookAlert{ID: n.alertID, Kind: n.kind, Subject: n.subject, Summary: n.summary, Details: n.details,
			FiredAt: n.firedAt.UTC(), ResolvedAt: n.resolvedAt, RunbookURL: RunbookURL(n.kind)}})
	if err != nil {
		return fmt.Errorf("encode the webhook: %w", err)
	}
	now := time.Now()
	sig, err := whsign.Signature(a.cfg.WebhookSecret, "", time.Time{}, now, n.noticeID(), now.Unix(), body)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.cfg.WebhookURL, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("webhook %s: %w", redact.HostOnly(a.cfg.WebhookURL), redact.HostOnlyError(err, a.cfg.WebhookURL))
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("webhook-id", n.noticeID())
	req.Header.Set("webhook-timestamp", strconv.FormatInt(now.Unix(), 10))
	req.Header.Set("webhook-signature", sig)
	resp, err := a.http.Do(req)
	if err != nil {
		// The error's text holds the URL, which may hold a token: only its cause is kept.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return fmt.Errorf("webhook %s: %w", redact.HostOnly(a.cfg.WebhookURL), redact.HostOnlyError(err, a.cfg.WebhookURL))
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("webhook %s: status %d", redact.HostOnly(a.cfg.WebhookURL), resp.StatusCode)
	}
	return nil
}
