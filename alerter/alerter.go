package alerter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/lock-sensors/lock-sensors/internal/backoff"
	"github.com/lock-sensors/lock-sensors/internal/clock"
	"github.com/lock-sensors/lock-sensors/internal/netguard"
	"github.com/lock-sensors/lock-sensors/internal/part"
	"github.com/lock-sensors/lock-sensors/internal/rebuild"
)

// Projections lists the projections with their checkpoints and lag per partition, as the
// admin API's ListProjections shows them; the rebuild runner (projector/rebuild) is one.
type Projections interface {
	List(ctx context.Context) ([]rebuild.Info, error)
}

// Deps are what the alerter runs on. Projections may be nil: projection_lag is then not
// evaluated.
type Deps struct {
	Logger      *slog.Logger
	Registerer  prometheus.Registerer
	JS          jetstream.JetStream
	PG          *pgxpool.Pool
	Projections Projections
	// Clock is the time the conditions are judged at; nil is the system clock.
	Clock clock.Clock
}

// Alerter evaluates the alert conditions and sends their notices; see the package comment.
type Alerter struct {
	cfg       Config
	d         Deps
	log       *slog.Logger
	m         *metrics
	detectors []detector
	senders   []*sender
	http      *http.Client
}

// New checks the configuration and dependencies.
func New(cfg Config, d Deps) (*Alerter, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := part.Require("alerter", part.Dep{Name: "Logger", Value: d.Logger}, part.Dep{Name: "Registerer", Value: d.Registerer},
		part.Dep{Name: "JS", Value: d.JS}, part.Dep{Name: "PG", Value: d.PG}); err != nil {
		return nil, err
	}
	m, err := newMetrics(d.Registerer)
	if err != nil {
		return nil, err
	}
	d.Clock = clock.Or(d.Clock)
	a := &Alerter{cfg: cfg, d: d, log: d.Logger.With("part", "alerter"), m: m,
		// The operator chose the URL and may well point it at a private address; the rest of
		// the client webhooks' guard holds: no proxy from the environment, no redirects,
		// bounded response headers.
		http: netguard.HTTPClient(netguard.ClientConfig{Timeout: cfg.SendTimeout, AllowPrivate: true})}
	a.http.Timeout = cfg.SendTimeout
	a.detectors = a.newDetectors()
	for _, ch := range cfg.channels() {
		a.senders = append(a.senders, a.newSender(ch))
	}
	return a, nil
}

// Run evaluates and sends while this process holds the alerter's lock, and waits as a
// standby otherwise (trying again every Interval), until ctx is done.
func (a *Alerter) Run(ctx context.Context) error {
	a.log.Info("alerter starting", "interval", a.cfg.Interval, "channels", a.cfg.channels())
	for {
		if err := a.withLock(ctx, a.active); err != nil && ctx.Err() == nil {
			a.log.Warn("alerter: lost its lock or its database; trying again", "err", err)
		}
		if !backoff.Sleep(ctx, a.cfg.Interval) {
			return nil
		}
	}
}

// active is the work of the lock holder: the evaluation loop and one sender per channel.
// It returns when ctx is done or the lock's connection fails (ping).
func (a *Alerter) active(ctx context.Context, ping func(context.Context) error) error {
	a.m.active.Set(1)
	defer a.m.active.Set(0)
	a.log.Info("alerter active: this process evaluates and sends the alerts")
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		for {
			if err := ping(gctx); err != nil {
				return fmt.Errorf("lock connection: %w", err)
			}
			a.Evaluate(gctx)
			for _, s := range a.senders {
				s.wake()
			}
			if !backoff.Sleep(gctx, a.cfg.Interval) {
				return gctx.Err()
			}
		}
	})
	for _, s := range a.senders {
		g.Go(func() error { return s.run(gctx) })
	}
	err := g.Wait()
	if errors.Is(err, context.Canceled) && ctx.Err() != nil {
		return nil
	}
	return err
}

// Evaluate runs every detector once and applies the transitions. A detector that fails
// leaves its kind's alerts as they are (nothing resolves because a query failed).
func (a *Alerter) Evaluate(ctx context.Context) {
	for _, d := range a.detectors {
		conds, err := d.detect(ctx)
		if err == nil {
			err = a.reconcile(ctx, d.kind, conds)
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			a.m.evalErrors.WithLabelValues(d.kind).Inc()
			a.log.Warn("alert evaluation failed; its alerts stay as they are", "kind", d.kind, "err", err)
		}
	}
	a.m.evaluations.Inc()
}
