package ui_test

import (
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// clientToken makes a client token for clientID through the administrator API.
func (s *system) clientToken(t *testing.T, clientID string) (token, id string) {
	t.Helper()
	r := s.call(t, "POST", "/v1/clients/"+clientID+"/tokens", map[string]any{"name": "dashboard"})
	token, _ = r["token"].(string)
	id, _ = r["token_id"].(string)
	if !strings.HasPrefix(token, "lsct_") || id == "" {
		t.Fatalf("token answer: %v", r)
	}
	return token, id
}

// adminPages are the administrator's pages and actions, as typed by hand.
var adminPages = []struct{ method, path string }{
	{"GET", "/ui/panel/overview"}, {"GET", "/ui/panel/lost"}, {"GET", "/ui/panel/clients"}, {"GET", "/ui/panel/dead"},
	{"GET", "/ui/panel/setaside"}, {"GET", "/ui/panel/rebuilds"}, {"GET", "/ui/panel/alerts"},
	{"GET", "/ui/panel/processes"}, {"GET", "/ui/panel/logs"}, {"GET", "/ui/panel/nosuchpanel"},
	{"POST", "/ui/resend"}, {"POST", "/ui/enable"}, {"POST", "/ui/rebuild"},
}

// Issue 27, item 4: a client's people sign in with its client token and see its page only,
// in Chromium: its sensors and not another client's, a dead letter resent, a test event sent,
// the secret rotated; an administrator's page typed by hand answers 403, every one of them
// with the session's CSRF token too; and deleting the token ends the session.
func TestClientPageInBrowser(t *testing.T) {
	t.Parallel()
	startChromium()
	sys := startSystem(t)
	dir := artifacts(t)
	ctx := browser(t)

	rcv, mine := sys.failingClient(t, "Alarm company", "CliA1", "CliA2")
	_, other := sys.failingClient(t, "Other company", "CliB1")
	tok, tokID := sys.clientToken(t, mine)
	for _, s := range []string{"CliA1", "CliA2", "CliB1"} {
		sys.reading(t, s, 1)
		keepAlive(t, sys, s, 1) // online, no further events: the breaker stays closed
	}
	first := rcv.waitFailed(t)

	step(t, ctx, 30*time.Second, "sign in with the client token",
		chromedp.Navigate(sys.base+"/ui/"), chromedp.WaitVisible(chromedp.ID("token")),
		chromedp.SendKeys(chromedp.ID("token"), tok), chromedp.Click(chromedp.ID("signin")),
		chromedp.WaitVisible(chromedp.CSS(`#my-sensors tr[data-sensor="CliA1"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#my-sensors tr[data-sensor="CliA2"] td.state`)))
	if loc := location(t, ctx); !strings.HasSuffix(loc, "/ui/") {
		t.Fatalf("after sign-in the browser is at %s", loc)
	}
	body, err := chromedp.Run(ctx, chromedp.OuterHTML(chromedp.CSS("body")))
	if err != nil {
		t.Fatal(err)
	}
	for _, leak := range []string{"CliB1", other, "Other company", "/ui/panel/", "count-online", "rebuild"} {
		if strings.Contains(body, leak) {
			t.Errorf("the client's page shows %q", leak)
		}
	}
	shot(t, ctx, dir, "client-signed-in")

	t.Run("a dead letter resent from the client's page arrives", func(t *testing.T) {
		row := `#dead tr[data-event="` + first + `"]`
		step(t, ctx, 30*time.Second, "the dead letter on the page", chromedp.WaitVisible(chromedp.CSS(row)))
		step(t, ctx, 10*time.Second, "the dead letter counted", chromedp.WaitVisible(chromedp.CSS(`#my-stats .tile.bad #stat-dead`)))
		shot(t, ctx, dir, "client-dead-letter")
		rcv.setFailing(false)
		clickInPanel(t, ctx, 10*time.Second, "resend", row+` button.resend`)
		step(t, ctx, 10*time.Second, "resend clicked", chromedp.WaitVisible(chromedp.CSS(`#dead-result .ok`)))
		testenv.Eventually(t, 30*time.Second, "the resent delivery at the receiver", func() bool { return rcv.got(first) })
		step(t, ctx, 30*time.Second, "the dead letter gone from the page", chromedp.WaitNotPresent(chromedp.CSS(row)))
	})

	t.Run("a test event sent from the client's page arrives", func(t *testing.T) {
		step(t, ctx, 10*time.Second, "send test event clicked",
			chromedp.Click(chromedp.ID("test-event")), chromedp.WaitVisible(chromedp.CSS(`#actions-result .ok`)))
		msg, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(`#actions-result .ok`)))
		if err != nil {
			t.Fatal(err)
		}
		evt := regexp.MustCompile(`evt_test_\w+`).FindString(msg)
		if evt == "" {
			t.Fatalf("test event result %q names no event", msg)
		}
		testenv.Eventually(t, 30*time.Second, "the test event at the receiver", func() bool { return rcv.got(evt) })
		step(t, ctx, 30*time.Second, "the test event's attempt on the page",
			chromedp.WaitVisible(chromedp.CSS(`#attempts tr[data-event="`+evt+`"]`)))
		shot(t, ctx, dir, "client-test-event")
	})

	t.Run("rotate secret shows the new secret once", func(t *testing.T) {
		step(t, ctx, 10*time.Second, "rotate clicked",
			chromedp.Click(chromedp.ID("rotate-secret")), chromedp.WaitVisible(chromedp.ID("new-secret")))
		secret, err := chromedp.Run(ctx, chromedp.Text(chromedp.ID("new-secret")))
		if err != nil {
			t.Fatal(err)
		}
		c := sys.call(t, "GET", "/v1/clients/"+mine, nil)
		if !strings.HasPrefix(secret, "whsec_") || c["signing_secret"] != secret {
			t.Fatalf("the page showed %q; the client's secret is %v", secret, c["signing_secret"])
		}
	})

	t.Run("an administrator page typed by hand answers 403", func(t *testing.T) {
		step(t, ctx, 10*time.Second, "an administrator panel typed by hand", chromedp.Navigate(sys.base+"/ui/panel/clients"))
		status, err := chromedp.Run(ctx, chromedp.Evaluate[int](`performance.getEntriesByType("navigation")[0].responseStatus`))
		if err != nil {
			t.Fatal(err)
		}
		text, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS("body")))
		if err != nil {
			t.Fatal(err)
		}
		if status != http.StatusForbidden || !strings.Contains(text, "403 forbidden") || strings.Contains(text, "Other company") {
			t.Fatalf("/ui/panel/clients with a client session: %d %q", status, text)
		}
		shot(t, ctx, dir, "client-admin-url")

		// Every administrator page and action, with the client session and its CSRF token.
		jar, _ := cookiejar.New(nil)
		c := &http.Client{Jar: jar}
		res, err := c.PostForm(sys.base+"/ui/login", url.Values{"token": {tok}})
		if err != nil {
			t.Fatal(err)
		}
		page, _ := io.ReadAll(res.Body)
		res.Body.Close()
		m := regexp.MustCompile(`name="csrf" value="([^"]+)"`).FindSubmatch(page)
		if res.StatusCode != http.StatusOK || res.Request.URL.Path != "/ui/" || m == nil {
			t.Fatalf("client sign-in: %s at %s", res.Status, res.Request.URL)
		}
		for _, p := range adminPages {
			var res *http.Response
			if p.method == "GET" {
				res, err = c.Get(sys.base + p.path)
			} else {
				res, err = c.PostForm(sys.base+p.path, url.Values{"csrf": {string(m[1])}, "client_id": {other},
					"event_id": {first}, "name": {"state"}})
			}
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if res.StatusCode != http.StatusForbidden || strings.Contains(string(b), other) {
				t.Errorf("%s %s with a client session: %s %s", p.method, p.path, res.Status, b)
			}
		}
		// Nothing was started: the state projection shows no rebuild.
		for _, pr := range sys.call(t, "GET", "/v1/projections", nil)["projections"].([]any) {
			if pm := pr.(map[string]any); pm["rebuild"] != nil {
				t.Errorf("a client session started a rebuild: %v", pm["rebuild"])
			}
		}

		// Deleting the token ends its session at the next request.
		sys.call(t, "DELETE", "/v1/clients/"+mine+"/tokens/"+tokID, nil)
		nc := &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		res, err = nc.Get(sys.base + "/ui/")
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusSeeOther || !strings.HasPrefix(res.Header.Get("Location"), "/ui/login") {
			t.Errorf("GET /ui/ after the token was deleted: %s, Location %q", res.Status, res.Header.Get("Location"))
		}
	})
}
