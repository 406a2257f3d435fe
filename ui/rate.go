package ui

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/lock-sensors/lock-sensors/internal/netguard"
	"github.com/lock-sensors/lock-sensors/internal/procs"
)

// The ingest and invalid rates are the bridges' own counters (locks_bridge_readings_accepted_total,
// locks_bridge_invalid_total), read from the /metrics of each bridge process the registry
// lists, and differenced between two refreshes: the API process itself may run no bridge.
// So are the readings of unregistered sensors beyond LOCKS_UNREGISTERED_MAX
// (locks_unregistered_untracked_readings_total), with the places taken and their bound
// (locks_unregistered_tracked, locks_unregistered_max) as they are.

type counters struct{ accepted, invalid, untracked, unregTracked, unregMax float64 }

type rates struct {
	Ingest, Invalid, Untracked float64
	// UnregTracked and UnregMax are the unregistered sensors tracked and their bound.
	UnregTracked, UnregMax float64
	Bridges                int
	Known                  bool // two samples exist
	Err                    string
}

type rateMeter struct {
	client *http.Client
	mu     sync.Mutex
	at     time.Time
	prev   map[string]counters
	last   rates
}

// maxMetricsBytes bounds what one bridge's /metrics may send: the address comes from the
// registry, which a compromised bridge process writes.
const maxMetricsBytes = 4 << 20

func newRateMeter() *rateMeter {
	// The guarded client: no proxy, no redirects, bounded headers. Processes run on private
	// addresses, so those stay allowed.
	c := netguard.HTTPClient(netguard.ClientConfig{Timeout: 2 * time.Second, AllowPrivate: true})
	c.Timeout = 2 * time.Second
	return &rateMeter{client: c}
}

// checkProcessAddr accepts what a process's http_addr can be: host:port and nothing more, so
// a registry entry cannot point the API at a path, a user or a query of its choosing.
func checkProcessAddr(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host == "" || strings.ContainsAny(host, "/?#@%\\ ") {
		return fmt.Errorf("http_addr %q is not host:port", addr)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("http_addr %q is not host:port", addr)
	}
	if ip, err := netip.ParseAddr(host); err == nil && (ip.IsUnspecified() || ip.IsMulticast() || ip.IsLinkLocalUnicast()) {
		return fmt.Errorf("http_addr %q: not a process's address", addr)
	}
	return nil
}

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
	for _, c := range cur {
		// Only the bridge consuming the queue has loaded its places; a standby shows 0.
		r.UnregTracked = max(r.UnregTracked, c.unregTracked)
		r.UnregMax = max(r.UnregMax, c.unregMax)
	}
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
			r.Untracked += max(0, c.untracked-p.untracked) / span
		}
		r.Known = true
	}
	m.prev, m.at, m.last = cur, now, r
	return r
}

func (m *rateMeter) scrape(ctx context.Context, addr string) (counters, error) {
	if err := checkProcessAddr(addr); err != nil {
		return counters{}, err
	}
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
	body, err := io.ReadAll(io.LimitReader(res.Body, maxMetricsBytes+1))
	if err != nil {
		return counters{}, fmt.Errorf("/metrics: %w", err)
	}
	if len(body) > maxMetricsBytes {
		return counters{}, fmt.Errorf("/metrics: larger than %d MiB", maxMetricsBytes>>20)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		return counters{}, fmt.Errorf("/metrics: %w", err)
	}
	sum := func(name string) float64 {
		var s float64
		if f, ok := fams[name]; ok {
			for _, m := range f.GetMetric() {
				s += m.GetCounter().GetValue() + m.GetGauge().GetValue()
			}
		}
		return s
	}
	return counters{accepted: sum("locks_bridge_readings_accepted_total"), invalid: sum("locks_bridge_invalid_total"),
		untracked:    sum("locks_unregistered_untracked_readings_total"),
		unregTracked: sum("locks_unregistered_tracked"), unregMax: sum("locks_unregistered_max")}, nil
}
