package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/lock-sensors/lock-sensors/internal/config"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/ops"
	"github.com/lock-sensors/lock-sensors/internal/redact"
	"github.com/lock-sensors/lock-sensors/internal/sdnotify"
	"github.com/lock-sensors/lock-sensors/migrations"
	"github.com/lock-sensors/lock-sensors/notifier"
)

// postgresPools are the process's Postgres pools: the one its parts share and the webhook
// notifier's own (nil without the notifier). The notifier's statements over
// notifier_deliveries' partitions are the costliest to plan, and a connection plans them
// again whenever autovacuum touches a partition: kept on a few connections of their own,
// they are planned by those few, and no part waits for a connection another holds.
type postgresPools struct{ shared, notifier *pgxpool.Pool }

func (p postgresPools) Close() {
	if p.notifier != nil {
		p.notifier.Close()
	}
	p.shared.Close()
}

// openPostgres opens the process's pools, with their metrics and the readiness check; the
// caller closes them.
func openPostgres(ctx context.Context, cfg config.Config, targets []string, reg prometheus.Registerer, srv *ops.Server, log *slog.Logger) (postgresPools, error) {
	var p postgresPools
	shared, err := newPool(ctx, cfg, "locks "+strings.Join(targets, ","), 0, []string{"sensor_state"}, nil, log)
	if err != nil {
		return p, err
	}
	p.shared = shared
	pools := map[string]*pgxpool.Pool{"shared": shared}
	if slices.Contains(targets, "notifier") {
		n := notifierPoolSize(shared.Config().MaxConns)
		if p.notifier, err = newPool(ctx, cfg, "locks notifier", n, []string{"notifier_deliveries", "sensor_state"}, notifier.Warm, log); err != nil {
			shared.Close()
			return p, err
		}
		pools["notifier"] = p.notifier
	}
	reg.MustRegister(poolCollector{pools})
	srv.AddCheck("postgres", func(ctx context.Context) error { return migrations.PostgresReady(ctx, shared) })
	return p, nil
}

// newPool opens a pool named name in pg_stat_activity (unless the URL or PGAPPNAME names it)
// of size connections (0: poolSize), each warmed on tables and by plans when it opens
// (warmConnection), and opens its first connections.
func newPool(ctx context.Context, cfg config.Config, name string, size int32, tables []string, plans func(context.Context, *pgx.Conn) error, log *slog.Logger) (*pgxpool.Pool, error) {
	pcfg, err := pgxpool.ParseConfig(cfg.PostgresURL)
	if err != nil {
		return nil, fmt.Errorf("LOCKS_POSTGRES_URL=%s: %w", redact.URL(cfg.PostgresURL), redact.Error(err, cfg.PostgresURL))
	}
	if pcfg.ConnConfig.RuntimeParams["application_name"] == "" {
		pcfg.ConnConfig.RuntimeParams["application_name"] = name
	}
	// Short statements over partitioned tables pass the planner's JIT threshold, and
	// compiling them costs far more than running them. The URL wins.
	if pcfg.ConnConfig.RuntimeParams["jit"] == "" {
		pcfg.ConnConfig.RuntimeParams["jit"] = "off"
	}
	if size == 0 {
		size = poolSize(cfg.PostgresURL, pcfg.MaxConns, cfg.Partitions)
	}
	pcfg.MaxConns = size
	pcfg.AfterConnect = warmConnection(tables, plans, log)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("LOCKS_POSTGRES_URL=%s: %w", redact.URL(cfg.PostgresURL), redact.Error(err, cfg.PostgresURL))
	}
	prewarm(ctx, pool, int(min(size, prewarmConns())), log)
	return pool, nil
}

// openClickHouse opens the ClickHouse connection, with its readiness check; the caller
// closes it.
func openClickHouse(cfg config.Config, srv *ops.Server) (driver.Conn, error) {
	opts, err := clickhouse.ParseDSN(cfg.ClickHouseURL)
	if err != nil {
		return nil, &config.Error{Var: "LOCKS_CLICKHOUSE_URL", Value: redact.URL(cfg.ClickHouseURL), Reason: redact.In(err.Error(), cfg.ClickHouseURL)}
	}
	conn, err := clickhouse.Open(opts)
	if err != nil {
		return nil, fmt.Errorf("LOCKS_CLICKHOUSE_URL=%s: %w", redact.URL(cfg.ClickHouseURL), redact.Error(err, cfg.ClickHouseURL))
	}
	srv.AddCheck("clickhouse", func(ctx context.Context) error { return migrations.ClickHouseReady(ctx, conn) })
	return conn, nil
}

// checkAMQP checks that RabbitMQ answers and makes that a readiness check; the caller
// closes the probe.
func checkAMQP(ctx context.Context, cfg config.Config, srv *ops.Server) (*amqpProbe, error) {
	probe := newAMQPProbe(cfg.AMQPURL)
	if err := probe.Check(ctx); err != nil {
		_ = probe.Close()
		return nil, fmt.Errorf("LOCKS_AMQP_URL=%s: %w", redact.URL(cfg.AMQPURL), redact.Error(err, cfg.AMQPURL))
	}
	srv.AddCheck("rabbitmq", probe.Check)
	return probe, nil
}

// connectNATS connects to LOCKS_NATS_URL, or to an embedded server it starts when that is
// empty, declares (or checks) the streams and adds the readiness check. stop closes the
// connection and shuts the embedded server down.
func connectNATS(ctx context.Context, cfg config.Config, targets []string, srv *ops.Server, log *slog.Logger) (nc *nats.Conn, js jetstream.JetStream, stop func(), err error) {
	var closers []func()
	closeAll := func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	defer func() {
		if err != nil {
			closeAll() // a failure closes what was opened before it
		}
	}()
	natsURL := cfg.NATSURL
	var embedded *server.Server
	if natsURL == "" {
		if err := os.MkdirAll(cfg.DataDir, 0o755); err != nil {
			return nil, nil, nil, &config.Error{Var: "LOCKS_DATA_DIR", Value: cfg.DataDir, Reason: err.Error()}
		}
		embedded, err = natsx.Embedded(cfg.DataDir, cfg.NATSListen, cfg.NATSSync, cfg.Partitions, log)
		if err != nil {
			return nil, nil, nil, err
		}
		closers = append(closers, func() {
			embedded.Shutdown()
			embedded.WaitForShutdown()
			log.Info("embedded NATS stopped")
		})
		natsURL = embedded.ClientURL()
	}
	nc, err = dialNATS(cfg, natsURL, "locks", embedded != nil, log, natsOptionsFor(targets)...)
	if err != nil {
		return nil, nil, nil, err
	}
	closers = append(closers, nc.Close)
	if js, err = jetstream.New(nc); err != nil {
		return nil, nil, nil, err
	}
	declare := natsx.Declare
	if !cfg.NATSDeclare && embedded == nil {
		declare = natsx.CheckDeclared // a part's NATS user may not declare
	}
	if err = declareStreams(ctx, js, cfg, natsURL, declare); err != nil {
		return nil, nil, nil, err
	}
	srv.AddCheck("nats", func(ctx context.Context) error {
		if s := nc.Status(); s != nats.CONNECTED {
			return fmt.Errorf("connection %s", s)
		}
		_, err := js.Stream(ctx, natsx.ReadingsStream)
		return err
	})
	return nc, js, closeAll, nil
}

// awaitStop waits for the parts (done) to end, or for ctx to end and then for the parts
// to stop within shutdownGrace, telling systemd that the process is stopping.
func awaitStop(ctx context.Context, done <-chan error, log *slog.Logger) error {
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	log.Info("stopping", "grace", shutdownGrace)
	notify(sdnotify.Stopping, log)
	select {
	case err := <-done:
		if err != nil {
			return err
		}
		log.Info("stopped cleanly")
		return nil
	case <-time.After(shutdownGrace):
		return fmt.Errorf("parts did not stop within %s", shutdownGrace)
	}
}
