package ui

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// Issue 25, item 6: the ingest-rate panel reads the /metrics of the bridges the registry
// lists, and a registry entry is written by the process it describes: a compromised bridge
// may point the API anywhere. So the address must be host:port and nothing more, a redirect
// is not followed, and the response is read up to maxMetricsBytes.
func TestRateScrapeBounded(t *testing.T) {
	t.Parallel()
	m := newRateMeter()
	for _, addr := range []string{"127.0.0.1:1/admin?x=1", "user@127.0.0.1:1", "127.0.0.1", "169.254.169.254:80", "0.0.0.0:80", "[ff02::1]:80", "127.0.0.1:99999"} {
		if _, err := m.scrape(t.Context(), addr); err == nil || !strings.Contains(err.Error(), "http_addr") {
			t.Errorf("scrape(%q): %v, want the address refused", addr, err)
		}
	}
	var sent atomic.Int64
	endless := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		line := []byte("# " + strings.Repeat("x", 1022) + "\n")
		for range 64 << 10 { // 64 MiB unless the client stops reading
			n, err := w.Write(line)
			sent.Add(int64(n))
			if err != nil {
				return
			}
		}
	}))
	t.Cleanup(endless.Close)
	if _, err := m.scrape(t.Context(), strings.TrimPrefix(endless.URL, "http://")); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Fatalf("an endless /metrics: %v, want refused past the cap", err)
	}
	var followed atomic.Int64
	target := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { followed.Add(1) }))
	t.Cleanup(target.Close)
	redirect := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, target.URL+"/secret", http.StatusFound)
	}))
	t.Cleanup(redirect.Close)
	if _, err := m.scrape(t.Context(), strings.TrimPrefix(redirect.URL, "http://")); err == nil || followed.Load() != 0 {
		t.Fatalf("a redirecting /metrics: %v, followed %d times; want refused, not followed", err, followed.Load())
	}
}
