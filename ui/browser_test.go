package ui_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// chromium is the one headless Chromium of the test binary: the browser tests share its
// process, each in a browser context of its own (its own cookies, as a separate browser's).
var chromium struct {
	once   sync.Once
	ctx    context.Context
	cancel func()
	err    error
}

// closeChromium stops the shared Chromium, if a test started it.
func closeChromium() {
	if chromium.cancel != nil {
		chromium.cancel()
	}
}

// startChromium starts the shared Chromium in the background, so that it starts while the
// test starts its system; browser waits for it.
func startChromium() { go chromium.once.Do(launchChromium) }

func launchChromium() {
	path, err := exec.LookPath("chromium")
	if err != nil {
		chromium.err = fmt.Errorf("the dashboard's browser tests need Debian's chromium: run deploy/local/services.sh (or apt-get install chromium): %w", err)
		return
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.Headless,
		chromedp.NoSandbox, chromedp.DisableGPU, chromedp.WindowSize(1400, 1000))
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelCtx := chromedp.NewContext(alloc)
	chromium.ctx, chromium.cancel = ctx, func() { cancelCtx(); cancelAlloc() }
	if err := chromedp.Do(ctx); err != nil {
		chromium.err = fmt.Errorf("start chromium: %w", err)
	}
}

// browser is a new browser context in the shared Chromium for the whole test, each step in
// its tab; its tabs share the cookies of the sign-in, as an operator's browser would.
func browser(t *testing.T) context.Context {
	t.Helper()
	chromium.once.Do(launchChromium)
	if chromium.err != nil {
		t.Fatal(chromium.err)
	}
	ctx, cancel := chromedp.NewContext(chromium.ctx, chromedp.WithNewBrowserContext())
	t.Cleanup(cancel)
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("open a browser context: %v", err)
	}
	return ctx
}

// tab is another tab of ctx's browser context (the same cookies), closed when t ends.
func tab(t *testing.T, ctx context.Context) context.Context {
	t.Helper()
	c, cancel := chromedp.NewContext(ctx)
	t.Cleanup(cancel)
	if err := chromedp.Do(c); err != nil {
		t.Fatalf("open a tab: %v", err)
	}
	return c
}

// artifacts is where screenshots go: $LOCKS_TEST_ARTIFACTS, or a directory under the
// system's temp dir that outlives the test.
func artifacts(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("LOCKS_TEST_ARTIFACTS")
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "locks-test-artifacts")
	}
	dir = filepath.Join(dir, "ui-"+time.Now().UTC().Format("20060102T150405"))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshots in %s", dir)
	return dir
}

func shot(t *testing.T, ctx context.Context, dir, name string) {
	t.Helper()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Errorf("screenshot %s: %v", name, err)
		return
	}
	if err := os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644); err != nil {
		t.Error(err)
	}
}

func location(t *testing.T, ctx context.Context) string {
	t.Helper()
	loc, err := chromedp.Run(ctx, chromedp.Location())
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

// step runs actions in the browser within d, failing t with what it waited for.
func step(t *testing.T, ctx context.Context, d time.Duration, what string, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	c, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	if err := chromedp.Do(c, actions...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// clickInPanel clicks the element sel in a panel that refreshes itself. A refresh may replace
// the element between chromedp finding it and clicking it ("Could not find node"): nothing
// was clicked then, so it finds the new one and clicks again, within d.
func clickInPanel(t *testing.T, ctx context.Context, d time.Duration, what, sel string) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		c, cancel := context.WithDeadline(ctx, deadline)
		err := chromedp.Do(c, chromedp.Click(chromedp.CSS(sel)))
		cancel()
		if err == nil {
			return
		}
		if !strings.Contains(err.Error(), "Could not find node") || time.Now().After(deadline) {
			t.Fatalf("click %s (%s): %v", what, sel, err)
		}
	}
}

// clickAcrossRefresh clicks sel in panel as a person does who holds the button while the
// panel reloads: it moves the pointer onto the button, presses, waits until a reload of the
// panel has come back, and releases. The page must not swap a reload in while the button is
// pressed: a reload that replaces the button, or one of another panel that moves it, sends
// the release elsewhere and loses the click. A pointer that missed the button (a reload moved
// it first) is taken away and released off it, and the click tried again.
func clickAcrossRefresh(t *testing.T, ctx context.Context, panel, sel string) {
	t.Helper()
	c, cancel := context.WithTimeout(ctx, 10*uiRefresh)
	defer cancel()
	eval := func(what, js string) any {
		t.Helper()
		v, err := chromedp.Run(c, chromedp.Evaluate[any](js))
		if err != nil {
			t.Fatalf("%s (%s): %v", what, sel, err)
		}
		return v
	}
	mouse := func(what string, ev chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(c, ev); err != nil {
			t.Fatalf("%s %s: %v", what, sel, err)
		}
	}
	left := []chromedp.MouseOption{chromedp.ButtonLeft, chromedp.ClickCount(1)}
	eval("count the panel's reloads", `(() => {
		window.locksTestReloads = 0;
		document.addEventListener("htmx:beforeSwap", (e) => {
			if (e.detail.target.id === "`+panel+`" && e.detail.requestConfig.verb === "get") window.locksTestReloads++;
		});
	})()`)
	q := `document.querySelector('` + sel + `')`
	for {
		at := eval("find", `(() => {
			const b = `+q+`;
			b.scrollIntoView({block: "center"});
			const r = b.getBoundingClientRect();
			return [r.x + r.width / 2, r.y + r.height / 2];
		})()`).([]any)
		x, y := at[0].(float64), at[1].(float64)
		mouse("move onto", chromedp.MouseEvent(chromedp.MouseMoved, x, y))
		if eval("hover", q+`.matches(":hover")`) != true {
			continue // moved by a reload on the way
		}
		mouse("press", chromedp.MouseEvent(chromedp.MousePressed, x, y, left...))
		if eval("press", q+`.matches(":active")`) != true {
			mouse("move off", chromedp.MouseEvent(chromedp.MouseMoved, 1, 1, chromedp.ButtonLeft))
			mouse("release off", chromedp.MouseEvent(chromedp.MouseReleased, 1, 1, left...))
			continue
		}
		n := eval("reloads", `window.locksTestReloads`).(float64)
		for eval("reloads", `window.locksTestReloads`).(float64) == n {
			time.Sleep(50 * time.Millisecond)
		}
		mouse("release", chromedp.MouseEvent(chromedp.MouseReleased, x, y, left...))
		return
	}
}

// The dashboard against a whole running system, in headless Chromium: sign-in, the lost
// list, a rebuild started from the page; and the access rules (no session: sign-in page; a
// POST without the CSRF token: refused). TestDashboardControlsInBrowser does the webhook
// controls beside it, on a system of its own: each waits out its system's timers.
func TestDashboardInBrowser(t *testing.T) {
	t.Parallel()
	startChromium()
	sys := startSystem(t)
	dir := artifacts(t)
	ctx := browser(t)

	t.Run("without a session the page redirects to sign-in", func(t *testing.T) {
		c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		for _, p := range []string{"/ui/", "/ui/panel/overview"} {
			res, err := c.Get(sys.base + p)
			if err != nil {
				t.Fatal(err)
			}
			res.Body.Close()
			if res.StatusCode != http.StatusSeeOther || !strings.HasPrefix(res.Header.Get("Location"), "/ui/login") {
				t.Errorf("GET %s without a session: %s, Location %q; want 303 to /ui/login", p, res.Status, res.Header.Get("Location"))
			}
		}
	})

	t.Run("sign in", func(t *testing.T) {
		var loc string
		step(t, ctx, 30*time.Second, "the sign-in page",
			chromedp.Navigate(sys.base+"/ui/"), chromedp.WaitVisible(chromedp.ID("token")))
		loc = location(t, ctx)
		if !strings.Contains(loc, "/ui/login") {
			t.Fatalf("without a session the browser is at %s, not the sign-in page", loc)
		}
		step(t, ctx, 10*time.Second, "a wrong token refused",
			chromedp.SendKeys(chromedp.ID("token"), "not-a-token-at-all-0000"), chromedp.Click(chromedp.ID("signin")),
			chromedp.WaitVisible(chromedp.ID("login-error")))
		step(t, ctx, 30*time.Second, "the dashboard after signing in",
			chromedp.SendKeys(chromedp.ID("token"), token), chromedp.Click(chromedp.ID("signin")),
			chromedp.WaitVisible(chromedp.ID("count-online")))
		loc = location(t, ctx)
		if !strings.HasSuffix(loc, "/ui/") {
			t.Fatalf("after sign-in the browser is at %s", loc)
		}
		shot(t, ctx, dir, "signed-in")
	})

	t.Run("a silent sensor appears in the lost list", func(t *testing.T) {
		sys.call(t, "POST", "/v1/sensors", map[string]any{"id": "UiLost1", "address": "Hall 1, east door"})
		sys.reading(t, "UiLost1", 1)
		var lastReading time.Time
		testenv.Eventually(t, 30*time.Second, "the reading in the state", func() bool {
			st := sys.callMaybe(t, "GET", "/v1/sensors/UiLost1/state")
			if st == nil {
				return false
			}
			lastReading, _ = time.Parse(time.RFC3339Nano, st["last_seen_time"].(string))
			return true
		})
		// Within lost_after + 5 s of the last reading, the sensor is in the list the page shows.
		deadline := lastReading.Add(lostAfter + 5*time.Second)
		step(t, ctx, time.Until(deadline), "UiLost1 in the lost list within lost_after + 5 s",
			chromedp.WaitVisible(chromedp.CSS(`#lost tr[data-sensor="UiLost1"]`)))
		step(t, ctx, 10*time.Second, "searching the lost list",
			chromedp.SendKeys(chromedp.ID("lost-q"), "east door"),
			chromedp.WaitVisible(chromedp.CSS(`#lost tr[data-sensor="UiLost1"]`)))
		shot(t, ctx, dir, "lost")
		step(t, ctx, 10*time.Second, "a search matching nothing",
			chromedp.SendKeys(chromedp.ID("lost-q"), " nowhere"),
			chromedp.WaitNotPresent(chromedp.CSS(`#lost tr[data-sensor="UiLost1"]`)))
		if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`(() => { const q = document.getElementById("lost-q");
			q.value = ""; q.dispatchEvent(new Event("input", {bubbles: true})); return true })()`)); err != nil {
			t.Fatal(err)
		}
		step(t, ctx, 10*time.Second, "the whole list again after clearing the search",
			chromedp.WaitVisible(chromedp.CSS(`#lost tr[data-sensor="UiLost1"]`)))
	})

	t.Run("a rebuild started from the page shows progress and ends", func(t *testing.T) {
		row := `#rebuilds tr.rebuild[data-projection="state"]`
		step(t, ctx, 10*time.Second, "rebuild clicked",
			chromedp.Click(chromedp.ID("rebuild-state")),
			chromedp.WaitVisible(chromedp.CSS(`#rebuild-result .ok`)),
			chromedp.WaitVisible(chromedp.CSS(row)))
		step(t, ctx, 60*time.Second, "the rebuild done", chromedp.WaitVisible(chromedp.CSS(row+`[data-phase="DONE"]`)))
		progress, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(row+` .progress`)))
		if err != nil {
			t.Fatal(err)
		}
		m := regexp.MustCompile(`^(\d+)/(\d+) 100%$`).FindStringSubmatch(strings.TrimSpace(progress))
		if m == nil || m[1] != m[2] || m[1] == "0" {
			t.Errorf("progress of the finished rebuild = %q, want n/n 100%% with n > 0", progress)
		}
		shot(t, ctx, dir, "dashboard")
	})

	t.Run("a POST without the CSRF token is refused", func(t *testing.T) {
		jar, _ := cookiejar.New(nil)
		c := &http.Client{Jar: jar}
		res, err := c.PostForm(sys.base+"/ui/login", url.Values{"token": {token}})
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusOK || res.Request.URL.Path != "/ui/" {
			t.Fatalf("sign-in: %s at %s", res.Status, res.Request.URL)
		}
		for _, v := range []url.Values{{"name": {"history"}}, {"name": {"history"}, "csrf": {"forged"}}} {
			res, err = c.PostForm(sys.base+"/ui/rebuild", v)
			if err != nil {
				t.Fatal(err)
			}
			res.Body.Close()
			if res.StatusCode != http.StatusForbidden {
				t.Errorf("POST /ui/rebuild with %v: %s, want 403", v, res.Status)
			}
		}
		// Nothing was started: the history projection shows no rebuild.
		p := sys.call(t, "GET", "/v1/projections", nil)
		for _, pr := range p["projections"].([]any) {
			if m := pr.(map[string]any); m["name"] == "history" && m["rebuild"] != nil {
				t.Errorf("a refused POST started a rebuild: %v", m["rebuild"])
			}
		}
	})
}

// The dashboard's webhook controls against a whole running system, in headless Chromium: a
// dead letter resent from the page, a failing endpoint disabled and re-enabled from it. The
// two concern different clients and sensors and wait on the system's timers (retries, the
// panels' refresh, disableAfter): they run side by side, each in a tab of the signed-in browser.
func TestDashboardControlsInBrowser(t *testing.T) {
	t.Parallel()
	startChromium()
	sys := startSystem(t)
	dir := artifacts(t)
	signedIn := browser(t)
	step(t, signedIn, 30*time.Second, "the dashboard after signing in",
		chromedp.Navigate(sys.base+"/ui/"), chromedp.WaitVisible(chromedp.ID("token")),
		chromedp.SendKeys(chromedp.ID("token"), token), chromedp.Click(chromedp.ID("signin")),
		chromedp.WaitVisible(chromedp.ID("count-online")))

	t.Run("a dead letter resent from the page arrives", func(t *testing.T) {
		t.Parallel()
		ctx := tab(t, signedIn)
		step(t, ctx, 30*time.Second, "the dashboard", chromedp.Navigate(sys.base+"/ui/"), chromedp.WaitVisible(chromedp.ID("count-online")))
		rcv, clientID := sys.failingClient(t, "Front desk", "UiDead1")
		sys.reading(t, "UiDead1", 0)
		// The same reading again and again keeps the sensor online without new events, so the
		// receiver sees only the state change's two attempts: not enough to open the client's
		// circuit breaker, whose cooldown would delay the resend by half a minute.
		keepAlive(t, sys, "UiDead1", 0)
		evt := rcv.waitFailed(t)
		row := `#dead tr[data-event="` + evt + `"]`
		step(t, ctx, 30*time.Second, "the dead letter on the page", chromedp.WaitVisible(chromedp.CSS(row)))
		step(t, ctx, 10*time.Second, "the failing client in the clients panel",
			chromedp.WaitVisible(chromedp.CSS(`#clients tr[data-client="`+clientID+`"] td.bad`)))
		alert := `#alerts tr.alert.%s[data-kind="dead_letter"][data-subject="client/` + clientID + `"]`
		step(t, ctx, 30*time.Second, "the dead letter's alert firing on the page",
			chromedp.WaitVisible(chromedp.CSS(fmt.Sprintf(alert, "firing"))))
		shot(t, ctx, dir, "dead-letter")
		rcv.setFailing(false)
		clickInPanel(t, ctx, 10*time.Second, "resend", row+` button.resend`)
		step(t, ctx, 10*time.Second, "resend clicked", chromedp.WaitVisible(chromedp.CSS(`#dead-result .ok`)))
		// The resend call names that one delivery (not a redrive over a time window).
		msg, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(`#dead-result .ok`)))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(msg, evt) {
			t.Errorf("resend result %q does not name the delivery %s", msg, evt)
		}
		if !strings.Contains(sys.log.String(), `msg="delivery resent" client_id=`+clientID+` event_id=`+evt) {
			t.Errorf("the API did not log the resend of %s to %s", evt, clientID)
		}
		testenv.Eventually(t, 30*time.Second, "the resent delivery at the receiver", func() bool { return rcv.got(evt) })
		step(t, ctx, 30*time.Second, "the dead letter gone from the page", chromedp.WaitNotPresent(chromedp.CSS(row)))
		step(t, ctx, 30*time.Second, "the dead letter's alert resolved on the page",
			chromedp.WaitVisible(chromedp.CSS(fmt.Sprintf(alert, "resolved"))))
		shot(t, ctx, dir, "alert-resolved")
	})

	t.Run("a failing endpoint is disabled and re-enabled from the page", func(t *testing.T) {
		t.Parallel()
		ctx := tab(t, signedIn)
		step(t, ctx, 30*time.Second, "the dashboard", chromedp.Navigate(sys.base+"/ui/"), chromedp.WaitVisible(chromedp.ID("count-online")))
		rcv, clientID := sys.failingClient(t, "Night desk", "UiOff1", "UiOff2", "UiOff3")
		// Each sensor's first reading is its one event: the same reading again keeps it online
		// (no connection events). The first event's two attempts fail (it goes dead): failing,
		// but not for disableAfter yet.
		sys.reading(t, "UiOff1", 1)
		keepAlive(t, sys, "UiOff1", 1)
		first := rcv.waitFailed(t)
		failingSince := time.Now()
		tr := `#clients tr[data-client="` + clientID + `"]`
		step(t, ctx, 10*time.Second, "the client shown failing",
			chromedp.WaitVisible(chromedp.CSS(tr+`[data-health="failing"] .failing`)))
		if has, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`document.querySelector('`+tr+` button.enable') !== null`)); err != nil || has {
			t.Fatalf("a failing endpoint not disabled yet offers Re-enable (%v, err %v)", has, err)
		}
		shot(t, ctx, dir, "endpoint-failing")
		// The next event's attempt, past disableAfter of failures, disables the endpoint. Fewer
		// than five failures in a row keep the circuit breaker closed, so it is attempted at once.
		time.Sleep(time.Until(failingSince.Add(disableAfter + time.Second)))
		sys.reading(t, "UiOff3", 1)
		keepAlive(t, sys, "UiOff3", 1)
		step(t, ctx, 30*time.Second, "the client shown disabled",
			chromedp.WaitVisible(chromedp.CSS(tr+`[data-health="disabled"] button.enable`)))
		reason, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(tr+` .reason`)))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(reason, "every attempt failed") {
			t.Errorf("disabled reason on the page = %q, want the notifier's reason", reason)
		}
		failed := rcv.failedIDs()
		if len(failed) != 2 || failed[0] != first {
			t.Fatalf("failed webhook-ids at the receiver = %v, want the first event and the one that disabled the endpoint", failed)
		}
		waited := failed[1]
		// While disabled, a new event waits unattempted.
		sys.reading(t, "UiOff2", 1)
		keepAlive(t, sys, "UiOff2", 1)
		testenv.Eventually(t, 30*time.Second, "two deliveries waiting", func() bool {
			st := sys.callMaybe(t, "GET", "/v1/clients/"+clientID+"/stats")
			return st != nil && st["pending"] == "2"
		})
		if n := len(rcv.failedIDs()); n != 2 {
			t.Fatalf("%d webhook-ids failed at the receiver while the endpoint was disabled, want still 2", n)
		}
		shot(t, ctx, dir, "endpoint-disabled")
		rcv.setFailing(false)
		clickAcrossRefresh(t, ctx, "clients", tr+` button.enable`)
		step(t, ctx, 10*time.Second, "the re-enable's result", chromedp.WaitVisible(chromedp.CSS(`#clients-result p`)))
		if msg, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(`#clients-result p`))); err != nil || !strings.Contains(msg, "re-enabled") {
			t.Fatalf("re-enable: the page says %q (%v), want it re-enabled", msg, err)
		}
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("receiver: failed %v, delivered %v; stats %v", rcv.failedIDs(), rcv.deliveredIDs(),
					sys.callMaybe(t, "GET", "/v1/clients/"+clientID+"/stats"))
			}
		})
		testenv.Eventually(t, 30*time.Second, "the deliveries that waited at the receiver", func() bool {
			got := rcv.deliveredIDs()
			return len(got) == 2 && slices.Contains(got, waited)
		})
		for _, id := range rcv.deliveredIDs() {
			if id != waited && slices.Contains(rcv.failedIDs(), id) {
				t.Errorf("the event that came while disabled (%s) was attempted before the re-enable", id)
			}
		}
		step(t, ctx, 10*time.Second, "the client shown enabled",
			chromedp.WaitVisible(chromedp.CSS(tr+` td.endpoint .enabled`)),
			chromedp.WaitNotPresent(chromedp.CSS(tr+` button.enable`)))
	})
}
