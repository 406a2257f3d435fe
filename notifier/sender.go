package notifier

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"syscall"
	"time"
)

// ErrForbiddenAddress says a webhook URL resolved to a loopback, private or otherwise
// internal address while LOCKS_WEBHOOK_ALLOW_PRIVATE is false.
var ErrForbiddenAddress = errors.New("webhook address is loopback, private or internal")

// ErrBadURL says a client's webhook URL is not an absolute http(s) URL.
var ErrBadURL = errors.New("webhook URL must be http:// or https:// with a host")

var cgnat = netip.MustParsePrefix("100.64.0.0/10")

// forbidden is whether ip is an address a webhook must not reach unless private targets
// are allowed: it is checked on the resolved address at dial time, so DNS that answers a
// public name with 127.0.0.1 (or rebinding between a check and the dial) cannot get through.
func forbidden(ip netip.Addr) bool {
	ip = ip.Unmap()
	return !ip.IsValid() || ip.IsLoopback() || ip.IsPrivate() || ip.IsUnspecified() ||
		ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast() || ip.IsInterfaceLocalMulticast() ||
		ip.IsMulticast() || cgnat.Contains(ip) || (ip.Is4() && ip.As4()[0] == 0)
}

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
		Control: func(_, address string, _ syscall.RawConn) error {
			if allowPrivate {
				return nil
			}
			ap, err := netip.ParseAddrPort(address)
			if err != nil {
				return fmt.Errorf("%w: %s", ErrForbiddenAddress, address)
			}
			if forbidden(ap.Addr()) {
				return fmt.Errorf("%w: %s", ErrForbiddenAddress, ap.Addr())
			}
			return nil
		},
	}
	tr := &http.Transport{
		Proxy:                 nil,
		DialContext:           d.DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          1024,
		MaxIdleConnsPerHost:   64,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   min(timeout, 10*time.Second),
		ResponseHeaderTimeout: timeout,
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
		return response{}, err
	}
	defer resp.Body.Close()
	// Read a bounded amount so the connection can be reused; a receiver streaming a huge
	// body must not hold a slot beyond the timeout either.
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	return response{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After")}, nil
}
