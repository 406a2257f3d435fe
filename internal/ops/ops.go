// Package ops serves what operators and orchestrators poll on LOCKS_HTTP_ADDR: /healthz
// (the process is alive), /readyz (every dependency of the running parts is reachable and
// migrated; 503 with the reasons otherwise) and /metrics (Prometheus). Other handlers, such
// as the REST gateway, are mounted beside them.
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
)

// Check reports whether one dependency is usable; nil means ready.
type Check func(ctx context.Context) error

// Server is the operations HTTP server.
type Server struct {
	addr   string
	log    *slog.Logger
	mux    *http.ServeMux
	mu     sync.Mutex
	checks map[string]Check
}

// New builds a server on addr exposing the metrics of g.
func New(addr string, g prometheus.Gatherer, log *slog.Logger) *Server {
	s := &Server{addr: addr, log: log, mux: http.NewServeMux(), checks: map[string]Check{}}
	s.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write([]byte("ok\n"))
	})
	s.mux.HandleFunc("GET /readyz", s.ready)
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

// AddCheck registers a readiness check under name (e.g. "postgres").
func (s *Server) AddCheck(name string, c Check) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.checks[name] = c
}

// Handle mounts h on pattern, e.g. the REST gateway on "/v1/".
func (s *Server) Handle(pattern string, h http.Handler) { s.mux.Handle(pattern, h) }

// Ready runs every check and returns the reason of each failure, by check name.
func (s *Server) Ready(ctx context.Context) map[string]string {
	s.mu.Lock()
	checks := make(map[string]Check, len(s.checks))
	for n, c := range s.checks {
		checks[n] = c
	}
	s.mu.Unlock()
	res := map[string]string{}
	var wg sync.WaitGroup
	var mu sync.Mutex
	for n, c := range checks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			status := "ok"
			if err := c(ctx); err != nil {
				status = err.Error()
			}
			mu.Lock()
			res[n] = status
			mu.Unlock()
		}()
	}
	wg.Wait()
	return res
}

func (s *Server) ready(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
	defer cancel()
	checks := s.Ready(ctx)
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
	srv := &http.Server{Handler: s.mux, ReadHeaderTimeout: 10 * time.Second}
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
