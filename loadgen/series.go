package loadgen

import (
	"context"
	"encoding/csv"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// StateProbe measures publish → state latency from outside the system: it polls
// sensor_state and, for every row whose changed_at (the ts of the reading that changed the
// state, which the load generator sets to its publish time) changed since the previous poll,
// takes the commit to have happened halfway between the two polls (or between the reading's
// ts and this poll, if later). The error is at most half the poll interval; only each
// sensor's newest change at a poll is seen, so with changes of one sensor closer together
// than the interval it samples. Changes only: a reading that changes nothing has its
// liveness written at most every LOCKS_STATE_SEEN_INTERVAL, by design.
type StateProbe struct {
	pool  *pgxpool.Pool
	since time.Time

	mu   sync.Mutex
	seen map[string]time.Time
	lat  []time.Duration
	lag  time.Duration
	err  error
}

// NewStateProbe watches the rows with readings from since on.
func NewStateProbe(pool *pgxpool.Pool, since time.Time) *StateProbe {
	return &StateProbe{pool: pool, since: since, seen: map[string]time.Time{}, lag: -1}
}

// Run polls every interval until ctx is done.
func (p *StateProbe) Run(ctx context.Context, every time.Duration) {
	prev := time.Now()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := time.Now()
		if err := p.poll(ctx, prev, now); err != nil && ctx.Err() == nil {
			p.mu.Lock()
			p.err = err
			p.mu.Unlock()
		}
		prev = now
	}
}

func (p *StateProbe) poll(ctx context.Context, prev, now time.Time) error {
	rows, err := p.pool.Query(ctx, "SELECT sensor_id, changed_at FROM sensor_state WHERE changed_at >= $1", p.since)
	if err != nil {
		return fmt.Errorf("state probe: %w", err)
	}
	defer rows.Close()
	var id string
	var ts, newest time.Time
	p.mu.Lock()
	defer p.mu.Unlock()
	for rows.Next() {
		if err := rows.Scan(&id, &ts); err != nil {
			return fmt.Errorf("state probe: %w", err)
		}
		if ts.After(newest) {
			newest = ts
		}
		if old, ok := p.seen[id]; ok && old.Equal(ts) {
			continue
		}
		p.seen[id] = ts
		from := prev
		if ts.After(from) {
			from = ts
		}
		at := from.Add(now.Sub(from) / 2)
		p.lat = append(p.lat, max(at.Sub(ts), 0))
	}
	if !newest.IsZero() {
		p.lag = max(now.Sub(newest), 0)
	}
	return rows.Err()
}

// Latencies returns the latencies measured after the first `from`, and how many in all.
func (p *StateProbe) Latencies(from int) ([]time.Duration, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	from = min(from, len(p.lat))
	return slices.Clone(p.lat[from:]), len(p.lat)
}

// Lag is the age of the newest change in sensor_state at the last poll (−1 before any).
func (p *StateProbe) Lag() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lag
}

// Err is the last poll's error, if it failed.
func (p *StateProbe) Err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// Sample is one second of a run. Rates are per second over that second; latencies are of
// what arrived in that second, in milliseconds, NaN when nothing did.
type Sample struct {
	T          float64 // seconds since the sampler started
	Published  float64 // readings confirmed by RabbitMQ
	Recorded   float64 // readings the bridge appended to READINGS
	Applied    float64 // READINGS messages the state projector committed to sensor_state
	Webhooks   float64 // distinct webhooks received
	WebhookP50 float64
	WebhookP99 float64
	StateP50   float64 // publish → committed to sensor_state (StateProbe)
	StateP99   float64
	StateLag   float64 // now − newest change in sensor_state
}

// Sampler takes a Sample every second from whichever sources are set.
type Sampler struct {
	Live       *Live
	BridgeURLs []string // /metrics of the processes running the bridge
	StateURLs  []string // /metrics of the processes running the state projector
	Receiver   *Receiver
	State      *StateProbe
	samples    []Sample
	mu         sync.Mutex
}

// Run samples every second until ctx is done.
func (s *Sampler) Run(ctx context.Context) {
	start := time.Now()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	var lastPub, lastRec, lastApp float64
	var lastReceived int64
	lastT := start
	var wFrom, sFrom int
	first := true
	rate := func(v, last float64, dt float64) float64 {
		if math.IsNaN(v) || math.IsNaN(last) {
			return math.NaN()
		}
		return (v - last) / dt
	}
	scrape := func(urls []string, names ...string) float64 {
		if len(urls) == 0 {
			return math.NaN()
		}
		m, err := Scrape(ctx, urls, names...)
		if err != nil {
			return math.NaN()
		}
		v := m[names[0]]
		for _, n := range names[1:] {
			v -= m[n]
		}
		return v
	}
	for {
		now := time.Now()
		pub := math.NaN()
		if s.Live != nil {
			pub = float64(s.Live.Published.Load())
		}
		rec := scrape(s.BridgeURLs, MetricAccepted, MetricDuplicates)
		app := scrape(s.StateURLs, MetricApplied)
		if !first {
			dt := now.Sub(lastT).Seconds()
			x := Sample{T: now.Sub(start).Seconds(), Published: rate(pub, lastPub, dt), Recorded: rate(rec, lastRec, dt),
				Applied: rate(app, lastApp, dt), Webhooks: math.NaN(), WebhookP50: math.NaN(), WebhookP99: math.NaN(),
				StateP50: math.NaN(), StateP99: math.NaN(), StateLag: math.NaN()}
			if s.Receiver != nil {
				n, _ := s.Receiver.Counts()
				x.Webhooks = float64(n-lastReceived) / dt
				lastReceived = n
				var l []time.Duration
				l, wFrom = s.Receiver.Latencies(wFrom)
				x.WebhookP50, x.WebhookP99 = Quantile(l, 0.5), Quantile(l, 0.99)
			}
			if s.State != nil {
				var l []time.Duration
				l, sFrom = s.State.Latencies(sFrom)
				x.StateP50, x.StateP99 = Quantile(l, 0.5), Quantile(l, 0.99)
				if lag := s.State.Lag(); lag >= 0 {
					x.StateLag = ms(lag)
				}
			}
			s.mu.Lock()
			s.samples = append(s.samples, x)
			s.mu.Unlock()
		} else if s.Receiver != nil {
			lastReceived, _ = s.Receiver.Counts()
			_, wFrom = s.Receiver.Latencies(math.MaxInt)
		}
		first = false
		lastPub, lastRec, lastApp, lastT = pub, rec, app, now
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Samples returns the samples so far.
func (s *Sampler) Samples() []Sample {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.samples)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// Quantile is the q-quantile of l in milliseconds (NaN when l is empty); l is sorted in place.
func Quantile(l []time.Duration, q float64) float64 {
	if len(l) == 0 {
		return math.NaN()
	}
	slices.Sort(l)
	return ms(l[int(q*float64(len(l)-1))])
}

// SeriesHeader is the first line of a time series CSV.
var SeriesHeader = []string{"t_s", "published_per_s", "recorded_per_s", "applied_per_s", "webhooks_per_s",
	"webhook_p50_ms", "webhook_p99_ms", "state_p50_ms", "state_p99_ms", "state_lag_ms"}

// WriteSeries writes samples as CSV, an empty cell for NaN.
func WriteSeries(w io.Writer, samples []Sample) error {
	cw := csv.NewWriter(w)
	_ = cw.Write(SeriesHeader)
	f := func(v float64) string {
		if math.IsNaN(v) {
			return ""
		}
		return strconv.FormatFloat(v, 'f', 3, 64)
	}
	for _, s := range samples {
		_ = cw.Write([]string{f(s.T), f(s.Published), f(s.Recorded), f(s.Applied), f(s.Webhooks),
			f(s.WebhookP50), f(s.WebhookP99), f(s.StateP50), f(s.StateP99), f(s.StateLag)})
	}
	cw.Flush()
	return cw.Error()
}

// WriteCDF writes the quantiles 0, 0.001, …, 1 of each named latency set (in ms) as CSV:
// a header q,<name>…, then one line per quantile. The sets are sorted in place.
func WriteCDF(w io.Writer, names []string, sets ...[]time.Duration) error {
	cw := csv.NewWriter(w)
	_ = cw.Write(append([]string{"q"}, names...))
	for _, l := range sets {
		slices.Sort(l)
	}
	for i := 0; i <= 1000; i++ {
		q := float64(i) / 1000
		row := []string{strconv.FormatFloat(q, 'f', 3, 64)}
		for _, l := range sets {
			if len(l) == 0 {
				row = append(row, "")
				continue
			}
			row = append(row, strconv.FormatFloat(ms(l[int(q*float64(len(l)-1))]), 'f', 3, 64))
		}
		_ = cw.Write(row)
	}
	cw.Flush()
	return cw.Error()
}
