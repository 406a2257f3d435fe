// Package health serves grpc.health.v1 on the gRPC port from the process's readiness checks
// (the /readyz checks of internal/ops), so that Kubernetes gRPC probes, meshes and
// grpc_health_probe see each service's status. A health call never runs a check: Run reads
// the readiness on a period and sets the statuses, which the calls and watches answer from.
package health

import (
	"context"
	"errors"
	"maps"
	"slices"
	"time"

	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/lock-sensors/lock-sensors/internal/part"
)

// EveryDefault is how often Run reads the readiness.
const EveryDefault = 2 * time.Second

// readTimeout bounds one read of the readiness, as /readyz bounds its checks.
const readTimeout = 3 * time.Second

// Config says which checks each service needs.
type Config struct {
	// Services maps a gRPC service's full name (locks.v1.ClientService) to the readiness
	// checks it needs ("postgres", "clickhouse", …). The server as a whole (service "")
	// needs every check.
	Services map[string][]string
	// Every is how often the readiness is read; 0 is EveryDefault.
	Every time.Duration
}

// Validate refuses a negative period.
func (c Config) Validate() error {
	if c.Every < 0 {
		return errors.New("health: Every must not be negative")
	}
	return nil
}

// Readiness returns the result of each readiness check by name: "ok", or why it fails. It
// is read every Config.Every, so it should answer from the last round of checks
// (ops' cached readiness) rather than run them.
type Readiness func(ctx context.Context) map[string]string

// Deps are what the health service is built from.
type Deps struct {
	Readiness Readiness
}

// Health is the grpc.health.v1 service of one process.
type Health struct {
	cfg       Config
	readiness Readiness
	srv       *health.Server
}

// New builds the service with every status NOT_SERVING until Run has read the readiness.
func New(cfg Config, deps Deps) (*Health, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := part.Require("health", part.Dep{Name: "Readiness", Value: deps.Readiness}); err != nil {
		return nil, err
	}
	if cfg.Every == 0 {
		cfg.Every = EveryDefault
	}
	h := &Health{cfg: cfg, readiness: deps.Readiness, srv: health.NewServer()}
	for name := range Statuses(cfg.Services, nil) {
		h.srv.SetServingStatus(name, healthpb.HealthCheckResponse_NOT_SERVING)
	}
	return h, nil
}

// Server is the service to register on the gRPC server.
func (h *Health) Server() healthpb.HealthServer { return h.srv }

// Run keeps the statuses current until ctx is done; then every status turns NOT_SERVING,
// so that a probe or a mesh stops sending calls while the server drains.
func (h *Health) Run(ctx context.Context) error {
	t := time.NewTicker(h.cfg.Every)
	defer t.Stop()
	for {
		h.update(ctx)
		select {
		case <-ctx.Done():
			h.srv.Shutdown()
			return nil
		case <-t.C:
		}
	}
}

func (h *Health) update(parent context.Context) {
	ctx, cancel := context.WithTimeout(parent, readTimeout)
	defer cancel()
	res := h.readiness(ctx)
	if parent.Err() != nil {
		return // stopping: Run turns everything NOT_SERVING
	}
	for name, st := range Statuses(h.cfg.Services, res) {
		h.srv.SetServingStatus(name, st)
	}
}

// Statuses is each service's status given the checks' results: SERVING when every check
// it needs that this process runs is "ok" (a check the process does not run is no
// dependency of it here); the server as a whole ("") when every check is "ok". Without
// results (nil: not read yet) everything is NOT_SERVING.
func Statuses(services map[string][]string, results map[string]string) map[string]healthpb.HealthCheckResponse_ServingStatus {
	out := make(map[string]healthpb.HealthCheckResponse_ServingStatus, len(services)+1)
	status := func(ok bool) healthpb.HealthCheckResponse_ServingStatus {
		if ok && results != nil {
			return healthpb.HealthCheckResponse_SERVING
		}
		return healthpb.HealthCheckResponse_NOT_SERVING
	}
	all := true
	for _, r := range results {
		all = all && r == "ok"
	}
	out[""] = status(all)
	for _, name := range slices.Sorted(maps.Keys(services)) {
		ok := true
		for _, c := range services[name] {
			if r, runs := results[c]; runs && r != "ok" {
				ok = false
			}
		}
		out[name] = status(ok)
	}
	return out
}
