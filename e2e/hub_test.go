package e2e_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lock-sensors/lock-sensors/loadgen"
)

// hub is the webhook receiver of many clients at once, for the envelope's fan-out and
// many-clients cases: one HTTP server on loopback listening on a few ports that the clients
// share (client i's URL is http://<port i mod ports>/c/<i>, so that the notifier's
// connections are spread over hosts as they would be over real receivers), each request's
// signature checked with its own client's secret, and the books kept per client and sensor.
// The contract makes a sensor's revision grow by exactly 1 per event and forbids an older one
// after a newer, so a client must get each of its sensors' revisions 1, 2, 3, … in that order:
// a repeat, a gap or a reorder is counted the moment it arrives.
type hub struct {
	srv     *http.Server
	lns     []net.Listener
	clients []*hubClient

	received atomic.Int64 // valid webhooks, repeats included

	mu     sync.Mutex
	events map[string]*hubEvent // by event id
	lat    []time.Duration      // every webhook's receipt − occurred_at (the reading's publish)
	last   time.Time            // the last webhook's receipt
}

type hubClient struct {
	mu     sync.Mutex
	secret []byte
	rev    map[string]int64 // sensor → last revision received
	got    int64
	repeat int64 // a revision received again (the same event twice)
	order  int64 // a revision not the one after the last received (a gap or an older one)
	badSig int64
	first  []string // the first problems, for the report
	odd    []string // the sensors of those problems
}

// hubEvent is one event's fan-out: when its reading was published and when its webhooks came.
type hubEvent struct {
	occurred    time.Time
	n           int
	first, last time.Time
}

// newHub serves n clients on ports listeners (at least 1, at most n).
func newHub(tb testing.TB, n, ports int) *hub {
	tb.Helper()
	h := &hub{events: map[string]*hubEvent{}}
	for range min(max(ports, 1), n) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			tb.Fatal(err)
		}
		h.lns = append(h.lns, ln)
	}
	for range n {
		h.clients = append(h.clients, &hubClient{rev: map[string]int64{}})
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /c/{i}", h.serve)
	h.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	for _, ln := range h.lns {
		go func() { _ = h.srv.Serve(ln) }()
	}
	tb.Cleanup(func() { _ = h.srv.Close() })
	return h
}

// urls are the clients' webhook URLs, by index.
func (h *hub) urls() []string {
	out := make([]string, len(h.clients))
	for i := range out {
		out[i] = "http://" + h.lns[i%len(h.lns)].Addr().String() + "/c/" + strconv.Itoa(i)
	}
	return out
}

// setSecrets gives each client its signing secret (whsec_<base64>).
func (h *hub) setSecrets(tb testing.TB, cs []loadgen.Client) {
	tb.Helper()
	for i, c := range cs {
		k, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(c.Secret, "whsec_"))
		if err != nil {
			tb.Fatalf("client %d's signing secret: %v", i, err)
		}
		h.clients[i].mu.Lock()
		h.clients[i].secret = k
		h.clients[i].mu.Unlock()
	}
}

// createClients creates a client per hub URL through reg, named <prefix><i>, saying every
// every-th one under what, and gives the hub their secrets.
func (h *hub) createClients(tb testing.TB, ctx context.Context, reg loadgen.Registrar, prefix, what string, every int64) []loadgen.Client {
	tb.Helper()
	var made atomic.Int64
	cs, err := reg.CreateClients(ctx, prefix, h.urls(), func() {
		if n := made.Add(1); n%every == 0 {
			progress("%s: %d of %d clients created", what, n, len(h.clients))
		}
	})
	if err != nil {
		tb.Fatal(err)
	}
	h.setSecrets(tb, cs)
	return cs
}

func (h *hub) serve(w http.ResponseWriter, r *http.Request) {
	now := time.Now()
	i, err := strconv.Atoi(r.PathValue("i"))
	if err != nil || i < 0 || i >= len(h.clients) {
		http.NotFound(w, r)
		return
	}
	c := h.clients[i]
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	var p struct {
		ID         string    `json:"id"`
		OccurredAt time.Time `json:"occurred_at"`
		Sensor     struct {
			ID string `json:"id"`
		} `json:"sensor"`
		Revision int64 `json:"revision"`
	}
	_ = json.Unmarshal(body, &p)
	c.mu.Lock()
	if !loadgen.ValidSignature(c.secret, r.Header, body) {
		c.badSig++
		c.mu.Unlock()
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	c.got++
	last := c.rev[p.Sensor.ID]
	switch {
	case p.Revision == last+1:
	case p.Revision == last:
		c.repeat++
		c.note(p.Sensor.ID, fmt.Sprintf("client %d, sensor %s: revision %d again", i, p.Sensor.ID, p.Revision))
	default:
		c.order++
		c.note(p.Sensor.ID, fmt.Sprintf("client %d, sensor %s: revision %d after %d", i, p.Sensor.ID, p.Revision, last))
	}
	c.rev[p.Sensor.ID] = max(last, p.Revision)
	c.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)

	h.received.Add(1)
	h.mu.Lock()
	e := h.events[p.ID]
	if e == nil {
		e = &hubEvent{occurred: p.OccurredAt, first: now}
		h.events[p.ID] = e
	}
	e.n++
	e.last = now
	h.lat = append(h.lat, now.Sub(p.OccurredAt))
	h.last = now
	h.mu.Unlock()
}

func (c *hubClient) note(sensor, p string) {
	if len(c.first) < 5 {
		c.first, c.odd = append(c.first, p), append(c.odd, sensor)
	}
}

// oddPair is a client (by index) and one of its sensors whose webhooks did not come as due.
type oddPair struct {
	client int
	sensor string
}

// check balances the books: client i must have got revisions 1 … want(i)[sensor] of each of
// its sensors, once each and in order, and nothing else. It returns the problems (at most 20)
// and the first few (client, sensor) pairs they are about.
func (h *hub) check(want func(i int) map[string]int64) (out []string, odd []oddPair) {
	oddOne := func(i int, s string) {
		if len(odd) < 5 {
			odd = append(odd, oddPair{i, s})
		}
	}
	add := func(s string) {
		if len(out) < 20 {
			out = append(out, s)
		} else if len(out) == 20 {
			out = append(out, "… and more")
		}
	}
	for i, c := range h.clients {
		c.mu.Lock()
		var expected int64
		w := want(i)
		for s, n := range w {
			expected += n
			if c.rev[s] != n {
				add(fmt.Sprintf("client %d, sensor %s: last revision %d, want %d", i, s, c.rev[s], n))
				oddOne(i, s)
			}
		}
		for s := range c.rev {
			if w[s] == 0 {
				add(fmt.Sprintf("client %d got sensor %s, not one of its sensors' changes", i, s))
				oddOne(i, s)
			}
		}
		if c.got != expected {
			add(fmt.Sprintf("client %d: %d webhooks, want %d", i, c.got, expected))
		}
		if c.repeat+c.order+c.badSig > 0 {
			add(fmt.Sprintf("client %d: %d repeated, %d out of order or after a gap, %d bad signatures: %v", i, c.repeat, c.order, c.badSig, c.first))
			for _, s := range c.odd {
				oddOne(i, s)
			}
		}
		c.mu.Unlock()
	}
	return out, odd
}

// failedAttempts logs and reports the attempts that failed, by error (a local receiver that
// answers every request at once should see none), and returns how many rows had one.
func failedAttempts(b *testing.B, pool *pgxpool.Pool) int64 {
	rows, err := pool.Query(b.Context(), `SELECT coalesce(last_error, 'status ' || last_status::text, ''), state, count(*)
		FROM notifier_deliveries WHERE failed_attempts > 0 GROUP BY 1, 2 ORDER BY 3 DESC LIMIT 10`)
	if err != nil {
		b.Fatal(err)
	}
	var total int64
	for rows.Next() {
		var e, state string
		var n int64
		if err := rows.Scan(&e, &state, &n); err != nil {
			b.Fatal(err)
		}
		total += n
		say(b, "%d deliveries with a failed attempt, now %s, the last failure: %s", n, state, e)
	}
	if err := rows.Err(); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(total), "deliveries-with-failed-attempts")
	return total
}

// explain logs the notifier's delivery rows of each odd pair (cs: the clients' ids by index):
// what the system did with the webhooks that did not come as due.
func explain(b *testing.B, pool *pgxpool.Pool, cs []loadgen.Client, odd []oddPair) {
	for _, o := range odd {
		rows, err := pool.Query(b.Context(), `SELECT (to_jsonb(d) - 'payload')::text FROM notifier_deliveries d
			WHERE d.client_id = $1 AND d.sensor_id = $2 ORDER BY d.revision`, cs[o.client].ID, o.sensor)
		if err != nil {
			say(b, "delivery rows of client %d, sensor %s: %v", o.client, o.sensor, err)
			continue
		}
		list, err := pgx.CollectRows(rows, pgx.RowTo[string])
		say(b, "delivery rows of client %d (%s), sensor %s (%v):\n%s", o.client, cs[o.client].ID, o.sensor, err, strings.Join(list, "\n"))
	}
}

// latencies are every webhook's receipt − the reading's publish, sorted, and the last receipt.
func (h *hub) latencies() ([]time.Duration, time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	l := slices.Clone(h.lat)
	slices.Sort(l)
	return l, h.last
}

// fanOut is, per event, the time from its reading's publish to the last of its webhooks,
// sorted, for the events that reached n clients; and how many did not.
func (h *hub) fanOut(n int) (done []time.Duration, short int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, e := range h.events {
		if e.n < n {
			short++
			continue
		}
		done = append(done, e.last.Sub(e.occurred))
	}
	slices.Sort(done)
	return done, short
}

// newest is the fan-out so far of the event whose reading was published last.
func (h *hub) newest() hubEvent {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out hubEvent
	for _, e := range h.events {
		if e.occurred.After(out.occurred) {
			out = *e
		}
	}
	return out
}
