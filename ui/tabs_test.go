package ui_test

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// apiCalls is locks_api_requests_total for method, summed over codes, from /metrics.
func (s *system) apiCalls(t *testing.T, method string) float64 {
	t.Helper()
	res, err := http.Get(s.base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var n float64
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "locks_api_requests_total{") || !strings.Contains(line, `method="`+method+`"`) {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err == nil {
			n += v
		}
	}
	return n
}

// Issue 25, item 8: ten tabs open on the dashboard cost the API (and its database) what one
// does: every panel is read at most once per half refresh period for all of them. Ten
// signed-in tabs poll the clients and dead-letter panels every tenth of the refresh period
// for 3 s (ten times faster than the page does, to leave no doubt); the per-client stats and
// dead-letter calls stay within one round per half refresh period, per client. The page
// reloads its panels every LOCKS_UI_REFRESH.
func TestTenTabsCostOneRead(t *testing.T) {
	t.Parallel()
	sys := startSystem(t)
	const clients = 5
	for i := range clients {
		sys.call(t, "POST", "/v1/clients", map[string]any{"name": fmt.Sprintf("tab-client-%d", i), "webhook_url": "http://127.0.0.1:9/hook"})
	}
	var tabs []*http.Client
	for range 10 {
		jar, _ := cookiejar.New(nil)
		c := &http.Client{Jar: jar}
		res, err := c.PostForm(sys.base+"/ui/login", url.Values{"token": {token}})
		if err != nil {
			t.Fatal(err)
		}
		page, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if !strings.HasSuffix(res.Request.URL.Path, "/ui/") {
			t.Fatalf("sign-in: %s at %s", res.Status, res.Request.URL)
		}
		if trigger := fmt.Sprintf(`hx-trigger="load, every %dms"`, uiRefresh.Milliseconds()); !strings.Contains(string(page), trigger) {
			t.Fatalf("the dashboard has no %s (LOCKS_UI_REFRESH=%s)", trigger, uiRefresh)
		}
		tabs = append(tabs, c)
	}
	statsBefore, deadBefore := sys.apiCalls(t, "GetClientStats"), sys.apiCalls(t, "ListClientDeliveries")
	start := time.Now()
	var wg sync.WaitGroup
	for _, c := range tabs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Since(start) < 3*time.Second {
				for _, p := range []string{"clients", "dead"} {
					res, err := c.Get(sys.base + "/ui/panel/" + p)
					if err != nil {
						t.Error(err)
						return
					}
					b, _ := io.ReadAll(res.Body)
					res.Body.Close()
					if res.StatusCode != http.StatusOK || !strings.Contains(string(b), "tab-client-") && p == "clients" {
						t.Errorf("panel %s: %s %.200s", p, res.Status, b)
						return
					}
				}
				time.Sleep(uiRefresh / 10)
			}
		}()
	}
	wg.Wait()
	rounds := float64(int(time.Since(start)/(uiRefresh/2)) + 2) // a read per half refresh
	if got := sys.apiCalls(t, "GetClientStats") - statsBefore; got > rounds*clients {
		t.Errorf("10 tabs for %s: %v client-stats calls, want at most %v (one round of %d clients per half refresh)", time.Since(start), got, rounds*clients, clients)
	}
	if got := sys.apiCalls(t, "ListClientDeliveries") - deadBefore; got > rounds*clients {
		t.Errorf("10 tabs for %s: %v dead-letter calls, want at most %v", time.Since(start), got, rounds*clients)
	}
}
