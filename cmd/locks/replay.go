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
	plan, err := o.plan()
	if err != nil {
		return err
	}
	st, err := openReplayStores(ctx, cfg, plan)
	if err != nil {
		return err
	}
	defer st.close()
	if o.dropOld {
		return st.dropOld(ctx, plan, log)
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
	if !plan.fromTime.IsZero() {
		if o.fromSeq, err = rebuild.ResolveFromTime(ctx, js, plan.fromTime); err != nil {
			return fmt.Errorf("--from-time=%s: %w", o.fromTime, err)
		}
		log.Info("--from-time resolved to the first READINGS message at or after it", "from_time", o.fromTime, "from_seq", o.fromSeq)
	}
	if o.rebase {
		// The live state projector picks the rebased checkpoints up by itself.
		_, err := state.Rebase(ctx, state.RebaseConfig{FromSeq: o.fromSeq}, state.RebuildDeps{JS: js, PG: st.pg, Logger: log})
		return err
	}
	out := replayOutput{tty: terminal(stderr), log: log}
	if plan.state {
		r, err := state.NewRebuild(state.RebuildConfig{PartitionCount: cfg.Partitions, FromSeq: o.fromSeq, BatchSize: o.batch,
			Progress: out.progress("state")}, state.RebuildDeps{JS: js, PG: st.pg, Logger: log})
		if err != nil {
			return err
		}
		res, err := r.Run(ctx)
		if err := out.report("state", res, err); err != nil {
			return err
		}
	}
	if plan.history {
		r, err := projhistory.NewRebuild(projhistory.RebuildConfig{PartitionCount: cfg.Partitions, FromSeq: o.fromSeq, Progress: out.progress("history")},
			projhistory.RebuildDeps{JS: js, CH: st.ch, Logger: log})
		if err != nil {
			return err
		}
		res, err := r.Run(ctx)
		if err := out.report("history", res, err); err != nil {
			return err
		}
	}
	return nil
}

// replayPlan is what the flags of a replay ask for: the projections to rebuild, and the
// time to start at (zero: --from-seq, or the stream's start).
type replayPlan struct {
	state, history bool
	fromTime       time.Time
}

// plan checks the flags and says what they ask for.
func (o *replayOptions) plan() (replayPlan, error) {
	p := replayPlan{
		state:   o.projection == state.Name || o.projection == "all",
		history: o.projection == projhistory.Name || o.projection == "all",
	}
	if !p.state && !p.history {
		return p, &config.Error{Var: "--projection", Value: o.projection, Reason: "want state, history or all"}
	}
	if o.rebase && (p.history || o.dropOld) {
		return p, &config.Error{Var: "--rebase", Value: "true", Reason: "only with --projection=state, and not with --drop-old"}
	}
	if o.fromTime != "" {
		if o.fromSeq != 0 {
			return p, &config.Error{Var: "--from-time", Value: o.fromTime, Reason: "--from-seq and --from-time exclude each other: give one"}
		}
		var err error
		if p.fromTime, err = time.Parse(time.RFC3339Nano, o.fromTime); err != nil {
			return p, &config.Error{Var: "--from-time", Value: o.fromTime, Reason: "want an RFC 3339 time such as 2026-11-22T10:00:00Z"}
		}
	}
	return p, nil
}

// replayStores are the databases of the projections a replay rebuilds: pg for state, ch for
// history (each nil when not rebuilt).
type replayStores struct {
	pg *pgxpool.Pool
	ch driver.Conn
}

// openReplayStores opens the databases plan needs.
func openReplayStores(ctx context.Context, cfg config.Config, plan replayPlan) (st replayStores, err error) {
	if plan.state {
		if st.pg, err = pgxpool.New(ctx, cfg.PostgresURL); err != nil {
			return st, fmt.Errorf("LOCKS_POSTGRES_URL=%s: %w", redact.URL(cfg.PostgresURL), redact.Error(err, cfg.PostgresURL))
		}
	}
	if plan.history {
		opts, err := clickhouse.ParseDSN(cfg.ClickHouseURL)
		if err != nil {
			st.close()
			return replayStores{}, &config.Error{Var: "LOCKS_CLICKHOUSE_URL", Value: redact.URL(cfg.ClickHouseURL), Reason: redact.In(err.Error(), cfg.ClickHouseURL)}
		}
		if st.ch, err = clickhouse.Open(opts); err != nil {
			st.close()
			return replayStores{}, fmt.Errorf("LOCKS_CLICKHOUSE_URL=%s: %w", redact.URL(cfg.ClickHouseURL), redact.Error(err, cfg.ClickHouseURL))
		}
	}
	return st, nil
}

func (st replayStores) close() {
	if st.ch != nil {
		_ = st.ch.Close()
	}
	if st.pg != nil {
		st.pg.Close()
	}
}

// dropOld is `locks replay --drop-old`: it drops the tables earlier rebuilds replaced.
func (st replayStores) dropOld(ctx context.Context, plan replayPlan, log *slog.Logger) error {
	var names []string
	if plan.state {
		n, err := state.DropOld(ctx, st.pg)
		if err != nil {
			return err
		}
		names = append(names, n...)
	}
	if plan.history {
		n, err := projhistory.DropOld(ctx, st.ch)
		if err != nil {
			return err
		}
		names = append(names, n...)
	}
	log.Info("dropped the tables replaced by earlier rebuilds", "tables", names)
	return nil
}

// terminal is w when it is a terminal, else nil.
func terminal(w io.Writer) *os.File {
	if f, ok := w.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			return f
		}
	}
	return nil
}

// replayOutput shows a rebuild's progress: one rewritten line on tty, or (tty nil) the
// rebuild's own log lines.
type replayOutput struct {
	tty *os.File
	log *slog.Logger
}

// progress is the Progress callback of the rebuild of projection name.
func (out replayOutput) progress(name string) func(rebuild.Progress) {
	if out.tty == nil {
		return nil // logged
	}
	return func(p rebuild.Progress) {
		pct := 100.0
		if p.Total > 0 {
			pct = 100 * float64(p.Done) / float64(p.Total)
		}
		fmt.Fprintf(out.tty, "\rrebuild %s: %-8s %d/%d (%.1f%%) %.0f msg/s ETA %s   ",
			name, p.Phase, p.Done, p.Total, pct, p.Rate, p.ETA.Round(time.Second))
	}
}

// report ends the progress line and logs the rebuild's result, or returns its error.
func (out replayOutput) report(name string, res rebuild.Result, err error) error {
	if out.tty != nil {
		fmt.Fprintln(out.tty)
	}
	if err != nil {
		return fmt.Errorf("rebuild %s: %w", name, err)
	}
	out.log.Info("replay done; the old tables are kept until `locks replay --drop-old`", "projection", name, "old", res.OldTable,
		"applied", res.Applied, "events_checked", res.EventsChecked, "elapsed", res.Elapsed.Round(time.Millisecond),
		"per_second", int64(float64(res.Applied)/max(res.Elapsed.Seconds(), 1e-9)))
	return nil
}
