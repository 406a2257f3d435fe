package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/lock-sensors/lock-sensors/internal/config"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/redact"
)

// dialNATS connects to url with the credentials of cfg. embedded says url is the embedded
// server of cfg.DataDir: then, unless LOCKS_NATS_NKEY or LOCKS_NATS_CREDS names another,
// its own credential from the data dir is used. extra adds options (the inbox prefix of a
// one-part process: natsOptionsFor).
func dialNATS(cfg config.Config, url, name string, embedded bool, log *slog.Logger, extra ...nats.Option) (*nats.Conn, error) {
	auth := cfg.NATSAuth
	if embedded && auth.Nkey == "" && auth.Creds == "" {
		auth = natsx.EmbeddedAuth(cfg.DataDir)
		if _, err := os.Stat(auth.Nkey); errors.Is(err, fs.ErrNotExist) {
			return nil, &config.Error{Var: "LOCKS_DATA_DIR", Value: cfg.DataDir, Reason: "no embedded NATS credential " + auth.Nkey +
				": give the data dir of the `locks run` whose server listens on LOCKS_NATS_LISTEN, or LOCKS_NATS_NKEY"}
		}
	}
	opts, err := auth.Options()
	if err != nil {
		return nil, &config.Error{Var: "LOCKS_NATS_CREDS/NKEY/CA/CERT/KEY", Value: "(files)", Reason: err.Error()}
	}
	nc, err := natsx.Connect(url, name, log, append(opts, extra...)...)
	if err != nil {
		return nil, fmt.Errorf("LOCKS_NATS_URL=%s: %w", redact.URL(url), redact.Error(err, url))
	}
	if err := natsx.CheckServerVersion(nc.ConnectedServerVersion()); err != nil {
		nc.Close()
		return nil, fmt.Errorf("LOCKS_NATS_URL=%s: %w", redact.URL(url), redact.Error(err, url))
	}
	return nc, nil
}

// declareStreams creates, completes (natsx.Declare) or only checks (natsx.CheckDeclared) the
// streams and buckets of cfg on js, the server at url.
func declareStreams(ctx context.Context, js jetstream.JetStream, cfg config.Config, url string,
	declare func(context.Context, jetstream.JetStream, natsx.StreamsConfig) error) error {
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	err := declare(dctx, js, natsx.StreamsConfig{Partitions: cfg.Partitions, Replicas: cfg.NATSReplicas, LostAfter: cfg.LostAfter, LeaseTTL: cfg.LeaseTTL,
		ReadingsMaxAge: cfg.ReadingsMaxAge, EventsMaxAge: cfg.EventsMaxAge, DeliveriesMaxAge: cfg.DeliveriesMaxAge,
		// The embedded server fsyncs every write by default: the bridge's batches then cost one
		// fsync each (docs/operations.md, "Durability"); syncing at an interval, single appends are faster.
		// An external server keeps its streams as they are.
		AtomicPublish: cfg.NATSURL == "" && cfg.NATSSync.Always, AtomicPublishExact: cfg.NATSURL == ""})
	if err != nil {
		return fmt.Errorf("NATS JetStream at %s: %w", redact.URL(url), redact.Error(err, url))
	}
	return nil
}

// declareNATS creates or completes the streams and buckets on LOCKS_NATS_URL, for `locks
// migrate`: where parts run as NATS users that may not declare (LOCKS_NATS_DECLARE=false),
// the operator's user does it once, with the databases' migrations.
func declareNATS(ctx context.Context, cfg config.Config, log *slog.Logger) error {
	nc, err := dialNATS(cfg, cfg.NATSURL, "locks-migrate", false, log)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	if err := declareStreams(ctx, js, cfg, cfg.NATSURL, natsx.Declare); err != nil {
		return err
	}
	log.Info("declared NATS streams and buckets", "replicas", cfg.NATSReplicas, "partitions", cfg.Partitions)
	return nil
}

// natsOptionsFor are the connection options of a process running targets: one part takes
// its replies and pushed messages under that part's inbox prefix, the only one its NATS user
// may subscribe to (natsx.PartPermissions); several parts in one process need a user allowed
// everything, and keep the default prefix.
func natsOptionsFor(targets []string) []nats.Option {
	if len(targets) != 1 {
		return nil
	}
	return []nats.Option{nats.CustomInboxPrefix(natsx.InboxPrefix(targets[0]))}
}
