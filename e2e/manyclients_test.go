package e2e_test

import (
	"io"
	"math"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"regexp"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"

	"github.com/lock-sensors/lock-sensors/internal/testenv"
	"github.com/lock-sensors/lock-sensors/loadgen"
)

// BenchmarkManyClients is issue 26's many-clients case of the scale envelope, opt-in like
// BenchmarkScaleEnvelope (LOCKS_BENCH_ENVELOPE=1, `go tool task bench:clients`):
// LOCKS_BENCH_CLIENTS clients (default 10,000) with LOCKS_BENCH_CLIENT_SENSORS sensors each
// (default 100: a million subscriptions), every sensor its one client's, client c's sensors
// being c, c + clients, c + 2 × clients, … of the fleet so that readings going round the
// fleet visit the clients in turn. All registered through the API's batch calls (the
// clients one call each: there is no batch call for them), each client's webhook URL on a
// local receiver (hub). Then readings at LOCKS_BENCH_CLIENTS_RATE (default 1,000/s), every
// one a change, for LOCKS_BENCH_CLIENTS_DURATION (default 60 s), under the defaults of
// `locks run --targets=all`.
//
// Reported: deliveries/s (the webhooks ÷ the time from the first publish to the last
// webhook, and the share of the publish rate), publish → webhook p50/p99, what a delivery
// cost Postgres (its backends' CPU, the statements' time, transactions) and the locks
// process; then, on the loaded tables, the time of the calls a client and an operator make
// (the client's stats and deliveries, the clients list, the count), and of the dashboard's
// panels, the operator's and a client's, each read uncached. The books are asserted: every
// client got each change of its sensors once, in revision order, and nothing else.
func BenchmarkManyClients(b *testing.B) {
	if os.Getenv("LOCKS_BENCH_ENVELOPE") == "" {
		b.Skip("opt-in: LOCKS_BENCH_ENVELOPE=1 (go tool task bench:clients)")
	}
	clients := int(envFloat(b, "LOCKS_BENCH_CLIENTS", 10_000))
	per := int(envFloat(b, "LOCKS_BENCH_CLIENT_SENSORS", 100))
	rate := envFloat(b, "LOCKS_BENCH_CLIENTS_RATE", 1000)
	dur := envDuration(b, "LOCKS_BENCH_CLIENTS_DURATION", time.Minute)
	for range b.N {
		benchManyClients(b, clients, per, rate, dur)
	}
}

func benchManyClients(b *testing.B, clients, per int, rate float64, dur time.Duration) {
	ctx := b.Context()
	s := start(b, "LOCKS_LOG_LEVEL=info")
	s.readyWithin = 5 * time.Minute
	pool, err := pgxpool.New(ctx, s.pgURL)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	h := newHub(b, clients, receiverPorts(b, clients))
	api := "http://" + s.http
	reg := loadgen.Registrar{APIURL: api, Token: s.token, Parallel: 8}
	b.ResetTimer()

	// 1. Registration: the fleet, the clients, their subscriptions.
	const prefix = "mc"
	n := clients * per
	t0 := time.Now()
	const chunk = 50_000
	for from := 0; from < n; from += chunk {
		if _, err := reg.Fleet(ctx, prefix, from, min(chunk, n-from), ""); err != nil {
			b.Fatal(err)
		}
		progress("many clients: %d of %d sensors registered", min(from+chunk, n), n)
	}
	registered := time.Since(t0)
	t0 = time.Now()
	cs := h.createClients(b, ctx, reg, "mc", "many clients", 1000)
	created := time.Since(t0)
	t0 = time.Now()
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(8)
	var subscribed atomic.Int64
	for c, cl := range cs {
		g.Go(func() error {
			ids := make([]string, per)
			for j := range per {
				ids[j] = loadgen.SensorID(prefix, c+j*clients)
			}
			if err := (loadgen.Registrar{APIURL: api, Token: s.token, Parallel: 1}).SubscribeIDs(gctx, cl.ID, ids); err != nil {
				return err
			}
			if k := subscribed.Add(1); k%1000 == 0 {
				progress("many clients: %d of %d clients subscribed to their %d sensors", k, clients, per)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		b.Fatal(err)
	}
	subs := time.Since(t0)
	b.ReportMetric(float64(n)/registered.Seconds(), "registrations/s")
	b.ReportMetric(float64(clients)/created.Seconds(), "clients-created/s")
	b.ReportMetric(float64(n)/subs.Seconds(), "subscriptions/s")
	say(b, "registered %d sensors in %s, created %d clients in %s, subscribed each to its %d sensors in %s", n, registered.Round(time.Millisecond),
		clients, created.Round(time.Millisecond), per, subs.Round(time.Millisecond))

	// 2. The load: every reading a change, round the fleet.
	m := startPG(b, pool, s.pid)
	machine := testenv.StartCPU(s.components())
	live := new(loadgen.Live)
	type res struct {
		books loadgen.Books
		err   error
	}
	done := make(chan res, 1)
	go func() {
		books, err := loadgen.Run(ctx, loadgen.Config{AMQPURL: s.rabbit.URL, Queue: s.rabbit.Queue, Sensors: n, Rate: rate,
			ChangeRatio: 1, Duration: dur, Prefix: prefix, Seed: 26, Live: live}, nil, testenv.Logger(b))
		done <- res{books, err}
	}()
	progress("many clients: publishing %.0f changes/s over %d sensors for %s", rate, n, dur)
	var out res
	tick := time.NewTicker(5 * time.Second)
	last, lastAt := int64(0), time.Now()
	report := func(now time.Time) {
		got := h.received.Load()
		progress("many clients: %d published, %.0f applied to the state, %.0f deliveries created, %d webhooks (%.0f/s in the last %s)",
			live.Published.Load(), s.metric("locks_state_applied_total"), s.metric("locks_notifier_deliveries_created_total"), got,
			float64(got-last)/now.Sub(lastAt).Seconds(), now.Sub(lastAt).Round(time.Second))
		last, lastAt = got, now
	}
	for waiting := true; waiting; {
		select {
		case out = <-done:
			waiting = false
		case now := <-tick.C:
			report(now)
		}
	}
	if out.err != nil {
		b.Fatal(out.err)
	}
	books := out.books
	// The rest of the webhooks: until all are in, or none came for 2 minutes.
	stalled, prev := time.Now(), h.received.Load()
	for got := prev; got < books.Changes; got = h.received.Load() {
		if got > prev {
			stalled, prev = time.Now(), got
		}
		if time.Since(stalled) > 2*time.Minute {
			b.Errorf("%d of %d webhooks, none for 2 minutes", got, books.Changes)
			break
		}
		select {
		case now := <-tick.C:
			report(now)
		case <-time.After(50 * time.Millisecond):
		}
	}
	tick.Stop()
	time.Sleep(2 * time.Second) // a repeat or a stray would come now
	lat, lastWebhook := h.latencies()
	use := machine.Stop()
	cost := m.stop(b, lastWebhook)
	progress("many clients: %d webhooks in; the API and the dashboard follow", h.received.Load())

	problems, odd := h.check(func(c int) map[string]int64 {
		w := map[string]int64{}
		for j := range per {
			id := loadgen.SensorID(prefix, c+j*clients)
			if k := books.ChangesOf[id]; k > 0 {
				w[id] = k
			}
		}
		return w
	})
	for _, p := range problems {
		b.Error("MISMATCH:", p)
	}
	explain(b, pool, cs, odd)
	failedAttempts(b, pool)
	delivered := float64(h.received.Load())
	took := lastWebhook.Sub(books.Start)
	pubRate := float64(books.Published) / books.End.Sub(books.Start).Seconds()
	b.ReportMetric(pubRate, "changes-published/s")
	b.ReportMetric(delivered/took.Seconds(), "deliveries/s")
	b.ReportMetric(loadgen.Quantile(lat, 0.5), "webhook-p50-ms")
	b.ReportMetric(loadgen.Quantile(lat, 0.99), "webhook-p99-ms")
	b.ReportMetric(float64(clients), "clients")
	b.ReportMetric(float64(n), "subscriptions")
	say(b, "%d clients × %d sensors: %d changes published at %.0f/s, %.0f webhooks in %s (%.0f deliveries/s), publish → webhook p50 %.0f ms, p99 %.0f ms",
		clients, per, books.Changes, pubRate, delivered, took.Round(time.Millisecond), delivered/took.Seconds(),
		loadgen.Quantile(lat, 0.5), loadgen.Quantile(lat, 0.99))
	cost.report(b, delivered, "delivery")
	testenv.ReportCPUPer(b, use, delivered, "delivery")

	// 3. The API's calls on the loaded tables, each the best and worst of 5.
	apiCall := func(name, path string) {
		var best, worst time.Duration = math.MaxInt64, 0
		for range 5 {
			t0 := time.Now()
			if code := s.call(http.MethodGet, path, nil, nil); code != http.StatusOK {
				b.Fatalf("GET %s: %d", path, code)
			}
			d := time.Since(t0)
			best, worst = min(best, d), max(worst, d)
		}
		b.ReportMetric(ms(best), name+"-best-ms")
		b.ReportMetric(ms(worst), name+"-worst-ms")
		say(b, "GET %s: best %s, worst %s of 5", path, best.Round(time.Microsecond), worst.Round(time.Microsecond))
	}
	c0 := cs[0].ID
	apiCall("client-stats", "/v1/clients/"+c0+"/stats")
	apiCall("client-deliveries", "/v1/clients/"+c0+"/deliveries?page_size=100")
	apiCall("client-sensors", "/v1/clients/"+c0+"/sensors?page_size=1000")
	apiCall("clients-list", "/v1/clients?page_size=1000")
	apiCall("sensors-count", "/v1/sensors:count")

	// 4. The dashboard: the operator's panels and a client's, each read after its cache
	// (half a refresh) expired, so that every read is the panel's whole cost.
	var tok struct {
		Token string `json:"token"`
	}
	if code := s.call(http.MethodPost, "/v1/clients/"+c0+"/tokens", map[string]string{"name": "envelope"}, &tok); code != http.StatusOK {
		b.Fatalf("create a client token: %d", code)
	}
	panels := func(who, token string, names ...string) {
		jar, _ := cookiejar.New(nil)
		hc := &http.Client{Jar: jar, Timeout: 5 * time.Minute}
		res, err := hc.PostForm(api+"/ui/login", url.Values{"token": {token}})
		if err != nil {
			b.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusOK || res.Request.URL.Path != "/ui/" {
			b.Fatalf("dashboard sign-in as %s: %s at %s", who, res.Status, res.Request.URL)
		}
		for _, name := range names {
			var best, worst time.Duration = math.MaxInt64, 0
			var failed []string
			for range 3 {
				time.Sleep(panelCacheExpiry)
				t0 := time.Now()
				res, err := hc.Get(api + name)
				if err != nil {
					b.Fatal(err)
				}
				body, _ := io.ReadAll(res.Body)
				res.Body.Close()
				if res.StatusCode != http.StatusOK {
					b.Fatalf("GET %s as %s: %s", name, who, res.Status)
				}
				d := time.Since(t0)
				best, worst = min(best, d), max(worst, d)
				// A panel that could not read its data says so in its body, with a 200.
				if m := panelError.FindSubmatch(body); m != nil {
					failed = append(failed, string(m[1]))
				}
			}
			unit := "ui" + name[len("/ui"):]
			b.ReportMetric(ms(best), unit+"-best-ms")
			b.ReportMetric(ms(worst), unit+"-worst-ms")
			b.ReportMetric(float64(len(failed)), unit+"-errors")
			say(b, "dashboard, %s: GET %s best %s, worst %s of 3; %d showed an error %q", who, name, best.Round(time.Microsecond),
				worst.Round(time.Microsecond), len(failed), failed)
		}
	}
	panels("operator", s.token, "/ui/panel/overview", "/ui/panel/clients", "/ui/panel/dead", "/ui/panel/lost")
	panels("client", tok.Token, "/ui/client/panel/stats", "/ui/client/panel/sensors", "/ui/client/panel/deliveries", "/ui/client/panel/events")
	b.StopTimer()
}

// panelError is the error a dashboard panel shows when it could not read its data.
var panelError = regexp.MustCompile(`class="error"[^>]*>([^<]+)<`)

// panelCacheExpiry is longer than the dashboard keeps a panel's data (half its 3 s refresh).
const panelCacheExpiry = 1600 * time.Millisecond
