package notifier

import (
	"net/http"
	"strconv"
	"time"

	"github.com/lock-sensors/lock-sensors/internal/event"
)

// The webhook of docs/contract.md section 2: a JSON body (Body) and the Standard Webhooks
// headers (Headers), signed by sign.go and posted by sender.go.

// Body is the webhook body of e for a sensor at address (event.WebhookBody, which the API's
// event feed serves too).
func Body(e event.Event, address string) ([]byte, error) {
	return event.WebhookBody(e, address)
}

// Secrets are a client's signing secrets as read at claim time: during a rotation the
// previous one also signs, until PreviousUntil.
type Secrets struct {
	Current       string
	Previous      string
	PreviousUntil time.Time
}

// Headers are the headers of one attempt, made at now, of the webhook id with body:
// webhook-id (the same on every attempt), webhook-timestamp (this attempt's unix seconds)
// and webhook-signature.
func Headers(s Secrets, id string, now time.Time, body []byte) (http.Header, error) {
	ts := now.Unix()
	sig, err := Signature(s.Current, s.Previous, s.PreviousUntil, now, id, ts, body)
	if err != nil {
		return nil, err
	}
	h := http.Header{}
	h.Set("Content-Type", "application/json")
	h.Set("User-Agent", "lock-sensors-webhooks/1")
	// Set as written: the spec's names are lower case, and Set would canonicalise them.
	h["webhook-id"] = []string{id}
	h["webhook-timestamp"] = []string{strconv.FormatInt(ts, 10)}
	h["webhook-signature"] = []string{sig}
	return h, nil
}
