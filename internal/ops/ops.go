// Package ops serves what operators and orchestrators poll on LOCKS_HTTP_ADDR: /healthz
// (the process is alive), /readyz (every dependency of the running parts is reachable and
// migrated; 503 naming the failing ones otherwise) and /metrics (Prometheus). Other
// handlers, such as the REST gateway, are mounted beside them.
//
// /readyz answers anyone, so it names a failing dependency but shows its error text (which
// can hold host names, user names and internal addresses) only to requests ShowDetailsTo
// accepts, and logs it when it changes; an error wrapped with Public is shown to all.
package ops

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/lock-sensors/lock-sensors/internal/redact"
)

// Check reports whether one dependency is usable; nil means ready.
type Check func(ctx context.Context) error

// Timeouts bound how long a client may take over a request and keep an idle connection, so
// that slow or idle clients cannot hold connections (and their goroutines) for ever.
type Timeouts struct {
	// ReadHeader is the time to send the request's headers.
	ReadHeader time.Duration
	// Read is the time to send the whole request, body included (the largest REST body
	// is 1 MiB).
	Read time.Duration
	// Idle is how long a kept-alive connection may wait for its next request.
	Idle time.Duration
}

// MaxHeaderBytes bounds a request's header (Go's default is 1 MiB): a bearer token, a
// session cookie and a browser's usual headers fit in far less.
const MaxHeaderBytes = 64 << 10

// DefaultTimeouts are the server's timeouts unless SetTimeouts changes them.
var DefaultTimeouts = Timeouts{ReadHeader: 10 * time.Second, Read: 30 * time.Second, Idle: 2 * time.Minute}

// Server is the operations HTTP server.
type Server struct {
	addr     string
	log      *slog.Logger
	mux      *http.ServeMux
	timeouts Timeouts

	mu      sync.Mutex
	checks  map[string]Check
	last    map[string]string // each check's last result, to log changes once
	details func(*http.Request) bool

	rounds roundCache // /readyz's and locks_ready's cached rounds of checks
}

// New builds a server on addr exposing the metrics of g.
func New(addr string, g prometheus.Gatherer, log *slog.Logger) *Server {
	s := &Server{addr: addr, log: log, mux: http.NewServeMux(), timeouts: DefaultTimeouts,
		checks: map[string]Check{}, last: map[string]string{}}
	s.rounds = roundCache{run: s.ready, every: ReadyEveryDefault}
	s.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write([]byte("ok\n"))
	})
	s.mux.HandleFunc("GET /readyz", s.serveReady)
	s.mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	return s
}

// EnablePprof serves Go's profiler under /debug/pprof/ (LOCKS_PPROF).
func (s *Server) EnablePprof() {
	s.mux.HandleFunc("GET /debug/pprof/", pprof.Index)
	s.mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
	s.mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	s.mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
	s.mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
}

// SetTimeouts replaces DefaultTimeouts; call it before Serve.
func (s *Server) SetTimeouts(t Timeouts) { s.timeouts = t }

// ShowDetailsTo makes /readyz show failing checks' error text to the requests allow accepts
// (the API's bearer tokens); others see only which checks failed.
func (s *Server) ShowDetailsTo(allow func(*http.Request) bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.details = allow
}

// Unavailable is what /readyz says of a failing check to a request that may not see details.
const Unavailable = "unavailable"

// AddCheck registers a readiness check under name (e.g. "postgres").
func (s *Server) AddCheck(name string, c Check) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.checks[name] = c
}

// Handle mounts h on pattern, e.g. the REST gateway on "/v1/".
func (s *Server) Handle(pattern string, h http.Handler) { s.mux.Handle(pattern, h) }

// Ready returns the reason of each check's failure ("ok" for a success), by check name, with
// the full error text, from the round /readyz answers with: a round runs at most once per
// interval, whoever asks.
func (s *Server) Ready(ctx context.Context) map[string]string {
	res, _ := s.rounds.get(ctx, s.rounds.interval())
	return res
}

// ready is Ready, plus the redacted reasons: Unavailable, or the text of an error marked redact.Public.
func (s *Server) ready(ctx context.Context) (full, redacted map[string]string) {
	s.mu.Lock()
	checks := make(map[string]Check, len(s.checks))
	for n, c := range s.checks {
		checks[n] = c
	}
	s.mu.Unlock()
	full, redacted = map[string]string{}, map[string]string{}
	var wg sync.WaitGroup
	var mu sync.Mutex
	for n, c := range checks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			status, shown := "ok", "ok"
			if err := c(ctx); err != nil {
				status, shown = err.Error(), Unavailable
				if redact.IsPublic(err) {
					shown = status
				}
			}
			mu.Lock()
			full[n], redacted[n] = status, shown
			mu.Unlock()
		}()
	}
	wg.Wait()
	s.logChanges(full)
	return full, redacted
}

// logChanges logs a check's error text when its result changes: the text no longer shows
// on /readyz without a token, and an orchestrator polling every few seconds must not flood
// the log either.
func (s *Server) logChanges(res map[string]string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for n, status := range res {
		prev, seen := s.last[n]
		if prev == status || (!seen && status == "ok") {
			continue
		}
		s.last[n] = status
		if status == "ok" {
			s.log.Info("readiness check passes again", "check", n)
		} else {
			s.log.Warn("readiness check fails", "check", n, "err", status)
		}
	}
}

func (s *Server) serveReady(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), readinessTimeout)
	defer cancel()
	full, checks := s.rounds.get(ctx, s.rounds.interval())
	s.mu.Lock()
	details := s.details
	s.mu.Unlock()
	if details != nil && details(r) {
		checks = full
	}
	ready := true
	for _, v := range checks {
		ready = ready && v == "ok"
	}
	w.Header().Set("Content-Type", "application/json")
	if !ready {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_ = json.NewEncoder(w).Encode(struct {
		Ready  bool              `json:"ready"`
		Checks map[string]string `json:"checks"`
	}{ready, checks})
}

// Listen binds the address now, so that a taken port fails start-up rather than later.
func (s *Server) Listen() (net.Listener, error) {
	ln, err := net.Listen("tcp", s.addr)
	if err != nil {
		return nil, fmt.Errorf("LOCKS_HTTP_ADDR=%s: %w", s.addr, err)
	}
	return ln, nil
}

// Serve serves on ln until ctx is done, then shuts down within 5 s.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{Handler: s.mux, ReadHeaderTimeout: s.timeouts.ReadHeader,
		ReadTimeout: s.timeouts.Read, IdleTimeout: s.timeouts.Idle, MaxHeaderBytes: MaxHeaderBytes}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	s.log.Info("HTTP listening", "addr", ln.Addr().String(), "paths", "/healthz /readyz /metrics")
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return nil
}
