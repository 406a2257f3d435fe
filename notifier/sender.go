package notifier

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/lock-sensors/lock-sensors/internal/netguard"
	"github.com/lock-sensors/lock-sensors/internal/redact"
)

// ErrForbiddenAddress says a webhook URL resolved to a loopback, private or internal
// address (netguard.Reason) while LOCKS_WEBHOOK_ALLOW_PRIVATE is false.
var ErrForbiddenAddress = netguard.ErrForbidden

// ErrBadURL says a client's webhook URL is not an absolute http(s) URL.
var ErrBadURL = errors.New("webhook URL must be http:// or https:// with a host")

// sender makes the HTTP requests with netguard's client (no proxy, no redirects, bounded
// response headers, the dial-time address check), a timeout per attempt, and kept-alive
// connections.
type sender struct {
	client  *http.Client
	timeout time.Duration
}

func newSender(timeout time.Duration, allowPrivate bool) *sender {
	return &sender{client: netguard.HTTPClient(netguard.ClientConfig{Timeout: timeout, AllowPrivate: allowPrivate}), timeout: timeout}
}

// response is what an attempt got back.
type response struct {
	status     int
	retryAfter string
}

// post sends one attempt; err is a transport failure (no status).
func (s *sender) post(ctx context.Context, rawURL string, h http.Header, body []byte) (response, error) {
	u, err := url.Parse(rawURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return response{}, ErrBadURL
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.String(), bytes.NewReader(body))
	if err != nil {
		return response{}, fmt.Errorf("build request: %w", err)
	}
	req.Header = h
	resp, err := s.client.Do(req)
	if err != nil {
		// net/http names the URL in its error, and the error is logged and stored in the
		// delivery history: keep a token in the receiver's query string out of both.
		var ue *url.Error
		if errors.As(err, &ue) {
			ue.URL = redact.WebhookURL(ue.URL)
		}
		return response{}, err
	}
	defer resp.Body.Close()
	// Read a bounded amount so the connection can be reused; a receiver streaming a huge
	// body must not hold a slot beyond the timeout either.
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	return response{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After")}, nil
}
