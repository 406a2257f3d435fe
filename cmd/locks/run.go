package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"golang.org/x/sync/errgroup"

	"github.com/lock-sensors/lock-sensors/alerter"
	"github.com/lock-sensors/lock-sensors/bridge"
	"github.com/lock-sensors/lock-sensors/internal/config"
	"github.com/lock-sensors/lock-sensors/internal/logfmt"
	"github.com/lock-sensors/lock-sensors/internal/ops"
	"github.com/lock-sensors/lock-sensors/internal/partition"
	"github.com/lock-sensors/lock-sensors/internal/rebuild"
	"github.com/lock-sensors/lock-sensors/internal/redact"
	"github.com/lock-sensors/lock-sensors/internal/sdnotify"
	"github.com/lock-sensors/lock-sensors/internal/tracing"
	"github.com/lock-sensors/lock-sensors/migrations"
	"github.com/lock-sensors/lock-sensors/notifier"
	projhistory "github.com/lock-sensors/lock-sensors/projector/history"
	rebuildrunner "github.com/lock-sensors/lock-sensors/projector/rebuild"
	"github.com/lock-sensors/lock-sensors/projector/state"
	"github.com/lock-sensors/lock-sensors/watchdog"
)

// allTargets are the parts `locks run` knows. Their order is only that of --help: the chosen
// parts are built in name order and then all run at once (see runParts).
var allTargets = []string{"bridge", "state", "history", "notifier", "watchdog", "api", "alerter"}

func allTargetsList() string { return strings.Join(allTargets, ",") }

// What each part needs besides NATS.
var (
	needsPostgres   = []string{"bridge", "state", "notifier", "watchdog", "api", "alerter"}
	needsClickHouse = []string{"history", "api", "alerter"}
	needsAMQP       = []string{"bridge"}
)

// shutdownGrace bounds how long the parts get to stop after SIGINT/SIGTERM.
const shutdownGrace = 15 * time.Second

type runOptions struct {
	targets    []string
	partitions partition.Set
	// auto: no --partitions; the state projector, notifier and watchdog take their share by
	// leases, the other parts take partitions (all of them).
	auto bool
}

func parseRunOptions(targets, partitions string, cfg config.Config) (runOptions, error) {
	var o runOptions
	for _, t := range strings.Split(targets, ",") {
		t = strings.TrimSpace(t)
		switch {
		case t == "all":
			o.targets = append(o.targets, allTargets...)
		case slices.Contains(allTargets, t):
			o.targets = append(o.targets, t)
		default:
			return o, &config.Error{Var: "--targets", Value: targets, Reason: "unknown part " + fmt.Sprintf("%q", t) + "; want all or a comma list of " + allTargetsList()}
		}
	}
	// Sorted to drop repeats and log the same list however it was given; not a start order.
	slices.Sort(o.targets)
	o.targets = slices.Compact(o.targets)
	o.auto = strings.TrimSpace(partitions) == "auto"
	if o.auto {
		partitions = "all"
	}
	p, err := partition.Parse(partitions, cfg.Partitions)
	if err != nil {
		return o, &config.Error{Var: "--partitions", Value: partitions, Reason: err.Error()}
	}
	o.partitions = p
	return o, nil
}

func (o runOptions) partitionsString() string {
	if o.auto {
		return "auto"
	}
	return fmt.Sprint(o.partitions)
}

func (o runOptions) any(parts []string) bool {
	return slices.ContainsFunc(o.targets, func(t string) bool { return slices.Contains(parts, t) })
}

// migrate applies the migrations of the databases asked for. Connection problems surface
// within migrations.ConnectTimeout with the variable named; a migration itself (moving a large
// table into partitions, or waiting for another process's run) gets migrateTimeout.
const migrateTimeout = 30 * time.Minute

func migrate(ctx context.Context, cfg config.Config, pg, ch bool, log *slog.Logger) error {
	if pg {
		c, cancel := context.WithTimeout(ctx, migrateTimeout)
		err := migrations.MigratePostgres(c, cfg.PostgresURL, log)
		cancel()
		if err != nil {
			return fmt.Errorf("LOCKS_POSTGRES_URL=%s: %w", redact.URL(cfg.PostgresURL), redact.Error(err, cfg.PostgresURL))
		}
	}
	if ch {
		c, cancel := context.WithTimeout(ctx, migrateTimeout)
		// Under the Postgres advisory lock, taken only when a migration is missing.
		err := migrations.MigrateClickHouseWith(c, cfg.ClickHouseURL, migrations.ClickHouseOptions{
			Cluster: cfg.ClickHouseCluster, LockPostgresURL: cfg.PostgresURL}, log)
		cancel()
		if err != nil {
			return fmt.Errorf("LOCKS_CLICKHOUSE_URL=%s: %w", redact.URL(cfg.ClickHouseURL), redact.Error(err, cfg.ClickHouseURL))
		}
	}
	return nil
}

// deps is everything a part may be built from; each part takes what it needs.
type deps struct {
	cfg        config.Config
	log        *slog.Logger
	nc         *nats.Conn
	js         jetstream.JetStream
	pg         *pgxpool.Pool
	notifierPG *pgxpool.Pool // the notifier's own (postgresPools)
	ch         driver.Conn
	reg        prometheus.Registerer
	ops        *ops.Server
	partitions partition.Set
	auto       bool
	tracing    *tracing.Tracing // nil: tracing off
}

// owned is what a part with leases is given: nil (its share, by leases) when auto, else --partitions.
func (d deps) owned() partition.Set {
	if d.auto {
		return nil
	}
	return d.partitions
}

// runner is what every part is: it runs until ctx is done and then returns after a clean stop.
type runner interface {
	Run(ctx context.Context) error
}

// buildPart wires one part by hand from deps.
func buildPart(name string, d deps) (runner, error) {
	switch name {
	case "bridge":
		unregMax := d.cfg.UnregisteredMax
		if unregMax == 0 {
			unregMax = -1 // none; the bridge's zero is its default
		}
		return bridge.New(bridge.Config{AMQPURL: d.cfg.AMQPURL, Queue: d.cfg.AMQPQueue, ClockSkewMax: d.cfg.ClockSkewMax,
			UnregisteredMax: unregMax, RefuseUnregistered: !d.cfg.AcceptUnregistered},
			bridge.Deps{JS: d.js, PG: d.pg, Logger: d.log, Registerer: d.reg, Tracer: d.tracing.Tracer("lock-sensors/bridge")})
	case "notifier":
		return notifier.New(notifier.Config{PartitionCount: d.cfg.Partitions, Partitions: d.owned(), LeaseTTL: d.cfg.LeaseTTL, RetrySchedule: d.cfg.RetrySchedule,
			WebhookTimeout: d.cfg.WebhookTimeout, LeaseMargin: d.cfg.WebhookLeaseMargin, WebhookAllowPrivate: d.cfg.WebhookAllowPrivate,
			DisableAfter: d.cfg.EndpointDisableAfter, MetricsMaxClients: d.cfg.MetricsMaxClients,
			Retention: d.cfg.NotifierRetention, DeadRetention: deadRetention(d.cfg.NotifierDeadRetention)},
			notifier.Deps{JS: d.js, PG: d.notifierPG, Logger: d.log, Registerer: d.reg, Tracer: d.tracing.Tracer("lock-sensors/notifier")})
	case "state":
		st, err := state.New(state.Config{Partitions: d.owned(), PartitionCount: d.cfg.Partitions, LeaseTTL: d.cfg.LeaseTTL,
			SeenInterval: d.cfg.StateSeenInterval},
			state.Deps{Logger: d.log, Registerer: d.reg, JS: d.js, PG: d.pg, Tracer: d.tracing.Tracer("lock-sensors/state")})
		if err != nil {
			return nil, err
		}
		// A partition whose checkpoint belongs to another READINGS stream is stopped: not ready.
		d.ops.AddCheck("state", st.Ready)
		return st, nil
	case "history":
		return projhistory.New(projhistory.Config{Partitions: d.partitions, PartitionCount: d.cfg.Partitions,
			BatchSize: d.cfg.HistoryBatchSize, FlushInterval: d.cfg.HistoryFlushInterval, Retention: d.cfg.HistoryRetention},
			projhistory.Deps{Logger: d.log, Registerer: d.reg, JS: d.js, CH: d.ch})
	case "watchdog":
		// The upstream is behind while the bridge's queue has no consumer or a backlog
		// beyond the bridge's prefetch window; expiries wait for it.
		return watchdog.New(watchdog.Config{PartitionCount: d.cfg.Partitions, Partitions: d.owned(), LeaseTTL: d.cfg.LeaseTTL, LostAfter: d.cfg.LostAfter, SweepEvery: d.cfg.WatchdogSweep,
			MaxHold: d.cfg.WatchdogMaxHold},
			watchdog.Deps{Logger: d.log, Registerer: d.reg, JS: d.js, PG: d.pg,
				Lag: watchdog.RabbitLag(d.cfg.AMQPURL, d.cfg.AMQPQueue, 1000, 250*time.Millisecond), Tracer: d.tracing.Tracer("lock-sensors/watchdog")})
	case "api":
		return newAPIPart(d)
	case "alerter":
		return newAlerter(d)
	default:
		return nil, fmt.Errorf("unknown part %q", name) // parseRunOptions admits only allTargets
	}
}

func runParts(ctx context.Context, cfg config.Config, o runOptions, log *slog.Logger) error {
	log.Info("starting", "version", versionString(), "targets", strings.Join(o.targets, ","),
		"partitions", o.partitionsString())
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		buildInfoGauge(readBuildInfo()))
	presence, log := newPresence(log, reg, o.targets)
	tr, err := tracing.Setup(ctx, os.Getenv, versionString())
	if err != nil {
		return err
	}
	if tr != nil {
		// Outermost, so that stderr and LOGS both get the trace ids.
		log = slog.New(logfmt.WithTrace(log.Handler()))
		log.Info("tracing on: spans go to the OTLP endpoint of OTEL_EXPORTER_OTLP_*")
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := tr.Shutdown(sctx); err != nil {
				log.Warn("the last spans were not exported", "err", err)
			}
		}()
	}
	srv := ops.New(cfg.HTTPAddr, reg, log)
	reg.MustRegister(srv.Readiness(ops.ReadinessReuseDefault))
	if cfg.Pprof {
		srv.EnablePprof()
	}
	ln, err := srv.Listen()
	if err != nil {
		return err
	}
	defer ln.Close()

	usePG, useCH := o.any(needsPostgres), o.any(needsClickHouse)
	if err := migrate(ctx, cfg, usePG, useCH, log); err != nil {
		return err
	}
	d := deps{cfg: cfg, log: log, reg: reg, ops: srv, partitions: o.partitions, auto: o.auto, tracing: tr}

	if usePG {
		pools, err := openPostgres(ctx, cfg, o.targets, reg, srv, log)
		if err != nil {
			return err
		}
		defer pools.Close()
		d.pg, d.notifierPG = pools.shared, pools.notifier
	}
	if useCH {
		conn, err := openClickHouse(cfg, srv)
		if err != nil {
			return err
		}
		defer conn.Close()
		d.ch = conn
	}
	if o.any(needsAMQP) {
		probe, err := checkAMQP(ctx, cfg, srv)
		if err != nil {
			return err
		}
		defer probe.Close()
	}
	nc, js, stopNATS, err := connectNATS(ctx, cfg, o.targets, srv, log)
	if err != nil {
		return err
	}
	defer stopNATS()
	d.nc, d.js = nc, js
	return runBuilt(ctx, d, o.targets, srv, ln, presence)
}

// runBuilt builds the targets' parts from d and runs them, with the ops server on ln and the
// process's presence, until ctx is done (then within shutdownGrace) or one of them fails.
func runBuilt(ctx context.Context, d deps, targets []string, srv *ops.Server, ln net.Listener, presence *processPresence) error {
	log := d.log
	var parts []runner
	var names []string
	for _, t := range targets {
		p, err := buildPart(t, d)
		if err != nil {
			return fmt.Errorf("%s: %w", t, err)
		}
		parts, names = append(parts, p), append(names, t)
	}

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return srv.Serve(gctx, ln) })
	side, err := presence.runners(d.js, names, ln.Addr().String(), log)
	if err != nil {
		return err
	}
	for _, run := range side {
		g.Go(func() error { return run(gctx) })
	}
	for i, p := range parts {
		g.Go(func() error {
			if err := p.Run(gctx); err != nil && !errors.Is(err, context.Canceled) {
				return fmt.Errorf("%s: %w", names[i], err)
			}
			return nil
		})
	}
	log.Info("running", "parts", strings.Join(names, ","), "http", ln.Addr().String())
	// Migrated, connected, streams checked, parts started: a Type=notify unit (deploy/systemd)
	// is started now, and the units ordered after it may start.
	notify(sdnotify.Ready, log)

	done := make(chan error, 1)
	go func() { done <- g.Wait() }()
	return awaitStop(ctx, done, log)
}

// newAlerter wires the alerter; it watches projection lag through a rebuild runner of its
// own that only lists (ListProjections' figures), never rebuilds.
func newAlerter(d deps) (runner, error) {
	rb, err := newRebuildRunner(d)
	if err != nil {
		return nil, err
	}
	a := d.cfg.Alerts
	return alerter.New(alerter.Config{Interval: a.Interval, Lag: a.Lag, SetAsideQuiet: a.SetAsideQuiet,
		MassLossShare: a.MassLossShare, MassLossMin: a.MassLossMin, SMTPURL: a.SMTPURL, EmailTo: a.EmailTo, EmailFrom: a.EmailFrom,
		WebhookURL: a.WebhookURL, WebhookSecret: a.WebhookSecret, MaxPerMinute: a.MaxPerMinute},
		alerter.Deps{Logger: d.log, Registerer: d.reg, JS: d.js, PG: d.pg, Projections: rb})
}

// newRebuildRunner wires the rebuild runner of the state and history projections.
func newRebuildRunner(d deps) (*rebuildrunner.Runner, error) {
	cfg := rebuildrunner.Config{PartitionCount: d.cfg.Partitions}
	return rebuildrunner.New(cfg, rebuildrunner.Deps{JS: d.js, Logger: d.log, Projections: []rebuild.Projection{
		state.NewProjection(state.RebuildConfig{PartitionCount: d.cfg.Partitions}, state.RebuildDeps{JS: d.js, PG: d.pg, Logger: d.log}),
		projhistory.NewProjection(projhistory.RebuildConfig{PartitionCount: d.cfg.Partitions}, projhistory.RebuildDeps{JS: d.js, CH: d.ch, Logger: d.log}),
	}})
}

// notify tells systemd the process's state when it runs as a Type=notify service; a failure
// only costs systemd's view of it, so it is logged, not fatal.
func notify(state string, log *slog.Logger) {
	if _, err := sdnotify.FromEnv(state); err != nil {
		log.Warn("sd_notify", "state", state, "socket", os.Getenv(sdnotify.SocketEnv), "err", err)
	}
}
