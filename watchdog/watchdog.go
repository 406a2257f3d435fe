package watchdog

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/sync/errgroup"

	"github.com/lock-sensors/lock-sensors/internal/backoff"
	"github.com/lock-sensors/lock-sensors/internal/clock"
	"github.com/lock-sensors/lock-sensors/internal/lease"
	"github.com/lock-sensors/lock-sensors/internal/logread"
	"github.com/lock-sensors/lock-sensors/internal/part"
	"github.com/lock-sensors/lock-sensors/internal/setaside"
)

// Deps are the watchdog's dependencies; all but Tracer are required.
type Deps struct {
	Logger     *slog.Logger
	Registerer prometheus.Registerer
	JS         jetstream.JetStream
	PG         *pgxpool.Pool
	// Lag is asked before held expiries are declared; see RabbitLag.
	Lag LagFunc
	// Clock is the time the decisions read; nil is the system clock.
	Clock clock.Clock
	// Tracer, when set, traces each declaration (trace.go); nil: no tracing.
	Tracer trace.Tracer
}

// Name is the watchdog's name in the partition leases (leases_watchdog) and the fence rows.
const Name = "watchdog"

// SetAsideConsumer names the watchdog in set-aside records and their metric.
const SetAsideConsumer = "watchdog"

// Watchdog turns expired liveness keys into liveness_timeout facts. See the package doc.
type Watchdog struct {
	cfg Config
	js  jetstream.JetStream
	pg  *pgxpool.Pool
	log *slog.Logger
	// clock is Deps.Clock: the time of the hold and settle decisions.
	clock clock.Clock
	// tracer is nil without tracing (trace.go).
	tracer trace.Tracer
	// leases gives this process its partitions (the fixed ones, or its share); each runs in own.
	leases *lease.Assigner
	// setAside records the READINGS messages that can never refresh a key.
	setAside *setaside.Recorder
	// upstream says whether held expiries must wait for the pipeline.
	upstream *upstream
	// overrides is the per-sensor lost_after, replaced whole by each reload.
	overrides atomic.Pointer[map[string]time.Duration]
	// partsMu guards parts, the owned partitions' consumer progress and refresh deadlines:
	// own adds a partition when this process claims it and removes it when it ends.
	partsMu sync.RWMutex
	parts   map[int]*partState

	// mu guards held and heldPeak: the watch and the sweep hold expiries, the declare loop
	// takes them to settle and puts back those that failed.
	mu   sync.Mutex
	held map[string]candidate
	// heldPeak is the most entries held since the map was last made, to know when
	// shrinking it gives memory back.
	heldPeak int
	// settling is the sensors whose due expiry is queued or being settled, queue the due
	// expiries no worker has taken yet, marks the declared marks owed (see declaredMark), workers how many settle workers run (at most
	// Concurrency), failed and failedFirst the settles that failed since the declare loop
	// last warned (all guarded by mu; see enqueue).
	settling    map[string]struct{}
	queue       []job
	marks       []declaredMark
	workers     int
	failed      int
	failedFirst error
	// workersDone is waited for by the declare loop before it returns.
	workersDone sync.WaitGroup
	// wake tells the declare loop that an expiry was held.
	wake chan struct{}
	// readings is the READINGS stream handle, looked up by the first declare round.
	readings atomic.Pointer[jetstream.Stream]
	// kv is the liveness bucket's stream, looked up by the first use (bucket).
	kv atomic.Pointer[jetstream.Stream]

	m    metrics
	gaps *logread.Gaps
}

// New checks cfg and deps and builds a Watchdog; Run starts it.
func New(cfg Config, d Deps) (*Watchdog, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := part.Require("watchdog", part.Dep{Name: "Logger", Value: d.Logger}, part.Dep{Name: "Registerer", Value: d.Registerer},
		part.Dep{Name: "JS", Value: d.JS}, part.Dep{Name: "PG", Value: d.PG}, part.Dep{Name: "Lag", Value: d.Lag}); err != nil {
		return nil, err
	}
	log := d.Logger.With("part", "watchdog")
	w := &Watchdog{
		cfg: cfg, js: d.JS, pg: d.PG, log: log, clock: clock.Or(d.Clock), tracer: d.Tracer,
		upstream: newUpstream(d.Lag, d.JS.Conn(), cfg.CatchUpGrace, log),
		parts:    map[int]*partState{},
		held:     map[string]candidate{},
		settling: map[string]struct{}{},
		wake:     make(chan struct{}, 1),
	}
	empty := map[string]time.Duration{}
	w.overrides.Store(&empty)
	var err error
	if w.m, err = newMetrics(d.Registerer); err != nil {
		return nil, err
	}
	if w.gaps, err = logread.NewGaps(d.Registerer, w.log, Name); err != nil {
		return nil, err
	}
	if w.setAside, err = setaside.NewRecorder(SetAsideConsumer, d.JS, w.log, d.Registerer); err != nil {
		return nil, err
	}
	if w.leases, err = lease.New(lease.Config{Name: Name, PartitionCount: cfg.PartitionCount, Partitions: cfg.Partitions,
		Owner: cfg.Owner, TTL: cfg.LeaseTTL}, lease.Deps{Logger: log, Registerer: d.Registerer, JS: d.JS, PG: d.PG, Clock: d.Clock}); err != nil {
		return nil, err
	}
	return w, nil
}

// Run consumes READINGS, watches the bucket, declares expiries and sweeps until ctx is done.
func (w *Watchdog) Run(ctx context.Context) error {
	// The overrides first: a sensor's first refresh must already use its own lost_after.
	for {
		err := w.loadOverrides(ctx)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		w.log.Warn("loading lost_after overrides; retrying", "err", err)
		backoff.Sleep(ctx, restartDelay)
	}
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return w.leases.Run(gctx, w.own) })
	g.Go(func() error { return w.declareLoop(gctx) })
	g.Go(func() error {
		return w.every(gctx, w.cfg.OverridesEvery, w.loadOverrides, "reload lost_after overrides")
	})
	g.Go(func() error {
		return w.every(gctx, w.cfg.PruneEvery, func(context.Context) error { w.pruneWritten(w.clock.Now()); return nil }, "prune refresh deadlines")
	})
	g.Go(func() error {
		return w.every(gctx, w.cfg.PositionEvery, w.savePositions, "write READINGS positions")
	})
	g.Go(func() error {
		return w.every(gctx, w.cfg.SweepEvery, func(ctx context.Context) error { _, err := w.Sweep(ctx); return err }, "reconciliation sweep")
	})
	err := g.Wait()
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// every runs f each period d until ctx is done; a failure is logged and tried next period.
func (w *Watchdog) every(ctx context.Context, d time.Duration, f func(context.Context) error, what string) error {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			if err := f(ctx); err != nil && ctx.Err() == nil {
				w.log.Warn(what+" failed", "err", err)
			}
		}
	}
}
