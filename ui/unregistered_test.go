package ui

import (
	"bytes"
	"html/template"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/lock-sensors/lock-sensors/internal/procs"
)

// Issue 25, item 9: the overview shows the unregistered sensors tracked against their bound and
// the rate of readings beyond it, from the bridges' own /metrics.
func TestOverviewShowsUntracked(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	untracked := prometheus.NewCounter(prometheus.CounterOpts{Name: "locks_unregistered_untracked_readings_total"})
	tracked := prometheus.NewGauge(prometheus.GaugeOpts{Name: "locks_unregistered_tracked"})
	bound := prometheus.NewGauge(prometheus.GaugeOpts{Name: "locks_unregistered_max"})
	reg.MustRegister(untracked, tracked, bound)
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	t.Cleanup(srv.Close)
	tracked.Set(100)
	bound.Set(100)

	now := time.Now()
	ps := []procs.Info{{ID: "b1", Parts: []string{"bridge"}, UpdatedAt: now, HTTPAddr: strings.TrimPrefix(srv.URL, "http://")}}
	m := newRateMeter()
	if r := m.read(t.Context(), ps, now); r.Err != "" || r.Known {
		t.Fatalf("first read: %+v", r)
	}
	untracked.Add(20)
	ps[0].UpdatedAt = now.Add(2 * time.Second)
	r := m.read(t.Context(), ps, now.Add(2*time.Second))
	if r.Err != "" || !r.Known || r.Untracked != 10 || r.UnregTracked != 100 || r.UnregMax != 100 {
		t.Fatalf("second read: %+v, want 10 untracked a second and 100 of 100 places", r)
	}

	pages, err := template.New("").Funcs(funcs).ParseFS(assets, "templates/*.html")
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := pages.ExecuteTemplate(&b, "panel-overview", map[string]any{"Rates": r, "Now": now}); err != nil {
		t.Fatal(err)
	}
	html := b.String()
	for _, want := range []string{`id="unregistered-tracked">100 / 100<`, `id="untracked-rate">10.0/s<`, `untracked readings`} {
		if !strings.Contains(html, want) {
			t.Fatalf("overview lacks %q:\n%s", want, html)
		}
	}
}
