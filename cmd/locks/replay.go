package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/lock-sensors/lock-sensors/internal/config"
	"github.com/lock-sensors/lock-sensors/internal/rebuild"
	"github.com/lock-sensors/lock-sensors/internal/redact"
	projhistory "github.com/lock-sensors/lock-sensors/projector/history"
	"github.com/lock-sensors/lock-sensors/projector/state"
)

// replayOptions are the flags of `locks replay`.
type replayOptions struct {
	projection string
	fromSeq    uint64
	fromTime   string
	batch      int
	dropOld    bool
	rebase     bool
}

func replayFlags(fs *flag.FlagSet) *replayOptions {
	o := &replayOptions{}
	fs.StringVar(&o.projection, "projection", "state", "projection to rebuild from the log: state, history or all")
	fs.Uint64Var(&o.fromSeq, "from-seq", 0, "start at this READINGS sequence; required when the stream no longer holds its start")
	fs.StringVar(&o.fromTime, "from-time", "", "start at the first READINGS message stored at or after this time (RFC 3339); excludes --from-seq")
	fs.IntVar(&o.batch, "batch-size", 5000, "READINGS messages per shadow transaction")
	fs.BoolVar(&o.dropOld, "drop-old", false, "drop the tables earlier rebuilds replaced, and do nothing else")
	fs.BoolVar(&o.rebase, "rebase", false, "state only: restart the checkpoints that belong to another READINGS stream (the NATS store was lost or replaced) "+
		"at the stream's start (or --from-seq/--from-time), keeping sensor_state, and do nothing else")
	return o
}

// runReplay rebuilds a projection into shadow tables and swaps it in, showing progress on
// stderr: one rewritten line on a terminal, log lines otherwise.
func runReplay(ctx context.Context, cfg config.Config, o *replayOptions, stderr io.Writer, log *slog.Logger) error {
	doState, doHistory := o.projection == state.Name || o.projection == "all", o.projection == projhistory.Name || o.projection == "all"
	if !doState && !doHistory {
		return &config.Error{Var: "--projection", Value: o.projection, Reason: "want state, history or all"}
	}
	if o.rebase && (doHistory || o.dropOld) {
		return &config.Error{Var: "--rebase", Value: "true", Reason: "only with --projection=state, and not with --drop-old"}
	}
	var fromTime time.Time
	if o.fromTime != "" {
		if o.fromSeq != 0 {
			return &config.Error{Var: "--from-time", Value: o.fromTime, Reason: "--from-seq and --from-time exclude each other: give one"}
		}
		var err error
		if fromTime, err = time.Parse(time.RFC3339Nano, o.fromTime); err != nil {
			return &config.Error{Var: "--from-time", Value: o.fromTime, Reason: "want an RFC 3339 time such as 2026-11-22T10:00:00Z"}
		}
	}
	var pool *pgxpool.Pool
	if doState {
		var err error
		if pool, err = pgxpool.New(ctx, cfg.PostgresURL); err != nil {
			return fmt.Errorf("LOCKS_POSTGRES_URL=%s: %w", redact.URL(cfg.PostgresURL), redact.Error(err, cfg.PostgresURL))
		}
		defer pool.Close()
	}
	var ch driver.Conn
	if doHistory {
		opts, err := clickhouse.ParseDSN(cfg.ClickHouseURL)
		if err != nil {
			return &config.Error{Var: "LOCKS_CLICKHOUSE_URL", Value: redact.URL(cfg.ClickHouseURL), Reason: redact.In(err.Error(), cfg.ClickHouseURL)}
		}
		if ch, err = clickhouse.Open(opts); err != nil {
			return fmt.Errorf("LOCKS_CLICKHOUSE_URL=%s: %w", redact.URL(cfg.ClickHouseURL), redact.Error(err, cfg.ClickHouseURL))
		}
		defer ch.Close()
	}
	if o.dropOld {
		var names []string
		if doState {
			n, err := state.DropOld(ctx, pool)
			if err != nil {
				return err
			}
			names = append(names, n...)
		}
		if doHistory {
			n, err := projhistory.DropOld(ctx, ch)
			if err != nil {
				return err
			}
			names = append(names, n...)
		}
		log.Info("dropped the tables replaced by earlier rebuilds", "tables", names)
		return nil
	}
	embedded := cfg.NATSURL == ""
	if embedded {
		// The embedded server of `locks run` listens on LOCKS_NATS_LISTEN.
		cfg.NATSURL = "nats://" + cfg.NATSListen
		log.Info("LOCKS_NATS_URL is empty: reading the log from the embedded NATS server of `locks run`", "url", cfg.NATSURL)
	}
	nc, err := dialNATS(cfg, cfg.NATSURL, "locks-replay", embedded, log)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	if !fromTime.IsZero() {
		if o.fromSeq, err = rebuild.ResolveFromTime(ctx, js, fromTime); err != nil {
			return fmt.Errorf("--from-time=%s: %w", o.fromTime, err)
		}
		log.Info("--from-time resolved to the first READINGS message at or after it", "from_time", o.fromTime, "from_seq", o.fromSeq)
	}
	if o.rebase {
		// The live state projector picks the rebased checkpoints up by itself.
		_, err := state.Rebase(ctx, state.RebaseConfig{FromSeq: o.fromSeq}, state.RebuildDeps{JS: js, PG: pool, Logger: log})
		return err
	}
	var tty *os.File
	if f, ok := stderr.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			tty = f
		}
	}
	progress := func(name string) func(rebuild.Progress) {
		if tty == nil {
			return nil // logged
		}
		return func(p rebuild.Progress) {
			pct := 100.0
			if p.Total > 0 {
				pct = 100 * float64(p.Done) / float64(p.Total)
			}
			fmt.Fprintf(tty, "\rrebuild %s: %-8s %d/%d (%.1f%%) %.0f msg/s ETA %s   ",
				name, p.Phase, p.Done, p.Total, pct, p.Rate, p.ETA.Round(time.Second))
		}
	}
	report := func(name string, res rebuild.Result, err error) error {
		if tty != nil {
			fmt.Fprintln(tty)
		}
		if err != nil {
			return fmt.Errorf("rebuild %s: %w", name, err)
		}
		log.Info("replay done; the old tables are kept until `locks replay --drop-old`", "projection", name, "old", res.OldTable,
			"applied", res.Applied, "events_checked", res.EventsChecked, "elapsed", res.Elapsed.Round(time.Millisecond),
			"per_second", int64(float64(res.Applied)/max(res.Elapsed.Seconds(), 1e-9)))
		return nil
	}
	if doState {
		r, err := state.NewRebuild(state.RebuildConfig{PartitionCount: cfg.Partitions, FromSeq: o.fromSeq, BatchSize: o.batch,
			Progress: progress("state")}, state.RebuildDeps{JS: js, PG: pool, Logger: log})
		if err != nil {
			return err
		}
		res, err := r.Run(ctx)
		if err := report("state", res, err); err != nil {
			return err
		}
	}
	if doHistory {
		r, err := projhistory.NewRebuild(projhistory.RebuildConfig{PartitionCount: cfg.Partitions, FromSeq: o.fromSeq, Progress: progress("history")},
			projhistory.RebuildDeps{JS: js, CH: ch, Logger: log})
		if err != nil {
			return err
		}
		res, err := r.Run(ctx)
		if err := report("history", res, err); err != nil {
			return err
		}
	}
	return nil
}
