// Package state is the state projector: READINGS applied to sensor_state in Postgres with
// exactly-once checkpoints, the events it derives written to an outbox and relayed to EVENTS,
// and the rebuild and rebase of that projection.
package state

import (
	"context"
	"errors"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/lock-sensors/lock-sensors/internal/clock"
	"github.com/lock-sensors/lock-sensors/internal/lease"
	"github.com/lock-sensors/lock-sensors/internal/logread"
	"github.com/lock-sensors/lock-sensors/internal/part"
	"github.com/lock-sensors/lock-sensors/internal/setaside"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/sync/errgroup"
)

// Projector is the state projector: per owned partition, a durable pull consumer on READINGS
// whose batches are applied to sensor_state in one transaction each (with the checkpoint and
// the outbox rows of the events they cause), and a relay publishing the outbox to EVENTS.
type Projector struct {
	cfg   Config
	js    jetstream.JetStream
	pg    *pgxpool.Pool
	log   *slog.Logger
	clock clock.Clock
	m     *metrics
	relay *Relay
	// leases gives this process its partitions (the fixed ones, or its share).
	leases *lease.Assigner
	// refused are the partitions whose checkpoints do not belong to READINGS (checkpoint.go).
	refused *refusals
	// setAside records the READINGS messages that can never be applied.
	setAside *setaside.Recorder
	gaps     *logread.Gaps
	tracer   trace.Tracer // nil: no tracing (trace.go)
}

// New checks the configuration and registers the metrics.
func New(cfg Config, d Deps) (*Projector, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := part.Require("state projector", part.Dep{Name: "JS", Value: d.JS}, part.Dep{Name: "PG", Value: d.PG},
		part.Dep{Name: "Logger", Value: d.Logger}, part.Dep{Name: "Registerer", Value: d.Registerer}); err != nil {
		return nil, err
	}
	m, err := newMetrics(d.Registerer)
	if err != nil {
		return nil, err
	}
	s := &Projector{cfg: cfg, js: d.JS, pg: d.PG, log: d.Logger.With("part", "state"), clock: clock.Or(d.Clock), m: m, tracer: d.Tracer}
	if s.gaps, err = logread.NewGaps(d.Registerer, s.log, Name); err != nil {
		return nil, err
	}
	if s.setAside, err = setaside.NewRecorder(Name, d.JS, s.log, d.Registerer); err != nil {
		return nil, err
	}
	if s.leases, err = lease.New(lease.Config{Name: Name, PartitionCount: cfg.PartitionCount, Partitions: cfg.Partitions,
		Owner: cfg.Owner, TTL: cfg.LeaseTTL}, lease.Deps{Logger: s.log, Registerer: d.Registerer, JS: d.JS, PG: d.PG, Clock: d.Clock}); err != nil {
		return nil, err
	}
	s.relay, err = newRelay(cfg, d)
	if err != nil {
		return nil, err
	}
	if s.refused, err = newRefusals(d.Registerer, Name, cfg.candidates(), s.log); err != nil {
		return nil, err
	}
	return s, nil
}

// Run applies the owned partitions and relays their outbox until ctx is done. It returns
// nil after a clean stop. A message it can never apply is set aside (see decodeBatch) and
// stops nothing.
func (s *Projector) Run(ctx context.Context) error {
	err := s.leases.Run(ctx, s.own)
	if ctx.Err() != nil && (err == nil || errors.Is(err, context.Canceled)) {
		return nil
	}
	return err
}

// own applies partition p and relays its outbox as the owner of epoch, until ctx is done or
// a batch is fenced (another process owns p now).
func (s *Projector) own(ctx context.Context, p int, epoch int64) error {
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return s.runPartition(gctx, p, epoch) })
	g.Go(func() error { return s.relay.run(gctx, p) })
	return g.Wait()
}

// Ready is nil unless a partition is stopped because its checkpoint does not belong to
// READINGS (for /readyz): the error names the partitions and the way out.
func (s *Projector) Ready(ctx context.Context) error { return s.refused.Ready(ctx) }

// nudge wakes partition p's relay after a commit wrote outbox rows.
func (s *Projector) nudge(p int) { s.relay.wake(p) }
