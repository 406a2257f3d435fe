package notifier

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
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

// maxResponseHeaderBytes bounds what a receiver's response headers may take in memory; a
// receiver that sends more fails the attempt (and it is retried) instead of costing the
// process up to net/http's default of 10 MB per attempt in flight.
const maxResponseHeaderBytes = 64 << 10

// sender makes the HTTP requests: no proxy (the dial-time check must see the real target),
// no redirects (a 3xx is a failed attempt), a timeout per attempt, and kept-alive connections.
type sender struct {
	client  *http.Client
	timeout time.Duration
}

func newSender(timeout time.Duration, allowPrivate bool) *sender {
	d := &net.Dialer{
		Timeout:   min(timeout, 5*time.Second),
		KeepAlive: 30 * time.Second,
	}
	// The check is on the resolved address at dial time, so DNS that answers a public name
	// with 127.0.0.1 (or rebinding between the API's check and the dial) cannot get through.
	if !allowPrivate {
		d.Control = netguard.Control
	}
	tr := &http.Transport{
		Proxy:                  nil,
		DialContext:            d.DialContext,
		ForceAttemptHTTP2:      true,
		MaxIdleConns:           1024,
		MaxIdleConnsPerHost:    64,
		IdleConnTimeout:        90 * time.Second,
		TLSHandshakeTimeout:    min(timeout, 10*time.Second),
		ResponseHeaderTimeout:  timeout,
		MaxResponseHeaderBytes: maxResponseHeaderBytes,
	}
	return &sender{
		client: &http.Client{
			Transport:     tr,
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
		timeout: timeout,
	}
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
