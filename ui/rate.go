package ui

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/lock-sensors/lock-sensors/internal/procs"
)

// The ingest and invalid rates are the bridges' own counters (locks_bridge_readings_accepted_total,
// locks_bridge_invalid_total), read from the /metrics of each bridge process the registry
// lists, and differenced between two refreshes: the API process itself may run no bridge.

type counters struct{ accepted, invalid float64 }

type rates struct {
	Ingest, Invalid float64
	Bridges         int
	Known           bool // two samples exist
	Err             string
}

type rateMeter struct {
	client *http.Client
	mu     sync.Mutex
	at     time.Time
	prev   map[string]counters
	last   rates
}

func newRateMeter() *rateMeter { return &rateMeter{client: &http.Client{Timeout: 2 * time.Second}} }

// minSpan is the shortest span rates are computed over; refreshes closer than it reuse the last.
const minSpan = time.Second

func (m *rateMeter) read(ctx context.Context, ps []procs.Info, now time.Time) rates {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.at.IsZero() && now.Sub(m.at) < minSpan {
		return m.last
	}
	cur := map[string]counters{}
	var errs []string
	for _, p := range ps {
		if !slices.Contains(p.Parts, "bridge") || p.Stale(now) || p.HTTPAddr == "" {
			continue
		}
		c, err := m.scrape(ctx, p.HTTPAddr)
		if err != nil {
			errs = append(errs, fmt.Sprintf("%s: %v", p.ID, err))
			continue
		}
		cur[p.ID] = c
	}
	r := rates{Bridges: len(cur)}
	if len(errs) > 0 {
		r.Err = fmt.Sprint(errs)
	}
	if m.prev != nil {
		span := now.Sub(m.at).Seconds()
		for id, c := range cur {
			p, ok := m.prev[id] // a bridge seen once has no rate yet
			if !ok {
				continue
			}
			r.Ingest += max(0, c.accepted-p.accepted) / span
			r.Invalid += max(0, c.invalid-p.invalid) / span
		}
		r.Known = true
	}
	m.prev, m.at, m.last = cur, now, r
	return r
}

func (m *rateMeter) scrape(ctx context.Context, addr string) (counters, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return counters{}, err
	}
	res, err := m.client.Do(req)
	if err != nil {
		return counters{}, err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return counters{}, fmt.Errorf("/metrics: %s", res.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(res.Body)
	if err != nil {
		return counters{}, fmt.Errorf("/metrics: %w", err)
	}
	sum := func(name string) float64 {
		var s float64
		if f, ok := fams[name]; ok {
			for _, m := range f.GetMetric() {
				s += m.GetCounter().GetValue()
			}
		}
		return s
	}
	return counters{accepted: sum("locks_bridge_readings_accepted_total"), invalid: sum("locks_bridge_invalid_total")}, nil
}
