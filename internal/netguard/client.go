package netguard

import (
	"net"
	"net/http"
	"time"
)

// MaxResponseHeaderBytes bounds what a receiver's response headers may take in memory: a
// receiver that sends more fails the attempt instead of costing the process up to
// net/http's default of 10 MB per request in flight.
const MaxResponseHeaderBytes = 64 << 10

// ClientConfig is what HTTPClient builds.
type ClientConfig struct {
	// Timeout bounds the dial, the TLS handshake and the wait for the response's headers.
	Timeout time.Duration
	// AllowPrivate lets the client reach the addresses Reason refuses.
	AllowPrivate bool
}

// HTTPClient is the client for URLs someone else chose (client webhooks, the operator's
// alert webhook): no proxy from the environment (the dial-time check must see the real
// target, and HTTP_PROXY set for other tools must not carry webhooks), no redirects (a 3xx
// is the receiver's answer, not a hop to an address nobody checked), bounded response
// headers, and unless c.AllowPrivate the addresses Reason refuses, judged at dial time so
// that DNS rebinding cannot get past the check.
func HTTPClient(c ClientConfig) *http.Client {
	d := &net.Dialer{
		Timeout:   min(c.Timeout, 5*time.Second),
		KeepAlive: 30 * time.Second,
	}
	if !c.AllowPrivate {
		d.Control = Control
	}
	tr := &http.Transport{
		Proxy:                  nil,
		DialContext:            d.DialContext,
		ForceAttemptHTTP2:      true,
		MaxIdleConns:           1024,
		MaxIdleConnsPerHost:    64,
		IdleConnTimeout:        90 * time.Second,
		TLSHandshakeTimeout:    min(c.Timeout, 10*time.Second),
		ResponseHeaderTimeout:  c.Timeout,
		MaxResponseHeaderBytes: MaxResponseHeaderBytes,
	}
	return &http.Client{
		Transport:     tr,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}
