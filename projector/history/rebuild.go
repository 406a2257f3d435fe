package history

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/lock-sensors/lock-sensors/internal/backoff"
	"github.com/lock-sensors/lock-sensors/internal/logread"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/part"
	"github.com/lock-sensors/lock-sensors/internal/rebuild"
)

// The rebuild of the history projection: each ClickHouse table (readings, events,
// deliveries) is filled again from its stream into a shadow (<table>_rebuild) while the live
// history projector keeps writing; when the shadows have caught up, one RENAME TABLE puts
// them in place (the old tables are kept as <table>_old_<time>), and the stream is read on
// up to its last sequence after the rename, so that whatever the live projector wrote into
// the old tables meanwhile is in the new ones too. The tables are ReplacingMergeTree keyed
// so that a row written twice collapses: writing the tail twice is harmless, and a rebuild
// that is stopped simply starts its shadows over. History derives no event: nothing is
// published.

// RebuildConfig configures a rebuild of the history projection.
type RebuildConfig struct {
	// FromSeq starts READINGS at this sequence; non-zero also accepts streams that no
	// longer hold their start.
	FromSeq uint64
	// BatchSize is the most rows per INSERT (default 20,000).
	BatchSize int
	// PartitionCount is READINGS' partition count, for the same check of each message as the
	// live projector's (a message it sets aside gets no row here either).
	PartitionCount int
	// ProgressEvery and Progress as in RebuildConfig.
	ProgressEvery time.Duration
	Progress      func(rebuild.Progress)
}

// Rebuild rebuilds the history projection; see the comment above.
type Rebuild struct {
	cfg RebuildConfig
	js  jetstream.JetStream
	ch  driver.Conn
	log *slog.Logger
}

// RebuildDeps are what a history rebuild runs on.
type RebuildDeps struct {
	Logger *slog.Logger
	JS     jetstream.JetStream
	CH     driver.Conn
}

// Defaults of RebuildConfig.
const (
	RebuildBatchSizeDefault     = 20_000
	RebuildProgressEveryDefault = time.Second
)

// NewRebuild checks the configuration and dependencies.
func NewRebuild(cfg RebuildConfig, d RebuildDeps) (*Rebuild, error) {
	if cfg.BatchSize == 0 {
		cfg.BatchSize = RebuildBatchSizeDefault
	}
	if cfg.ProgressEvery == 0 {
		cfg.ProgressEvery = RebuildProgressEveryDefault
	}
	if cfg.BatchSize < 1 {
		return nil, fmt.Errorf("history rebuild: batch size %d < 1", cfg.BatchSize)
	}
	if err := part.Require("history rebuild", part.Dep{Name: "Logger", Value: d.Logger}, part.Dep{Name: "JS", Value: d.JS},
		part.Dep{Name: "CH", Value: d.CH}); err != nil {
		return nil, err
	}
	log := d.Logger.With("part", "rebuild", "projection", Name)
	return &Rebuild{cfg: cfg, js: d.JS, ch: d.CH, log: log}, nil
}

// copier fills one table from its stream.
type copier struct {
	table  table
	stream string
	cons   *logread.Reader
	last   uint64 // the last stream sequence read
	done   atomic.Uint64
	pend   atomic.Uint64
}

// Run rebuilds the three history tables and swaps them in; it returns the suffix of the
// kept old tables (<table>_old_<time>) as OldTable.
func (r *Rebuild) Run(ctx context.Context) (rebuild.Result, error) {
	res, err := r.run(ctx)
	if err != nil && ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
		// Stopped: the driver reports a cancelled INSERT as whatever its cut connection
		// said; the cause is the stop, and callers match it with errors.Is.
		err = fmt.Errorf("%w: %w", ctx.Err(), err)
	}
	return res, err
}

func (r *Rebuild) run(ctx context.Context) (rebuild.Result, error) {
	start := time.Now()
	var res rebuild.Result
	streams := map[string]string{"readings": natsx.ReadingsStream, "events": natsx.EventsStream, "deliveries": natsx.DeliveriesStream}
	var copiers []*copier
	for _, t := range tables {
		c := &copier{table: t, stream: streams[t.name]}
		if err := r.plan(ctx, c); err != nil {
			return res, err
		}
		copiers = append(copiers, c)
		defer func() {
			if c.cons != nil {
				c.cons.Close(ctx)
			}
		}()
	}
	for _, c := range copiers {
		for _, q := range []string{"DROP TABLE IF EXISTS " + c.table.name + "_rebuild", "CREATE TABLE " + c.table.name + "_rebuild AS " + c.table.name} {
			if err := r.ch.Exec(ctx, q); err != nil {
				return res, fmt.Errorf("shadow of %s: %w", c.table.name, err)
			}
		}
		if err := r.open(ctx, c); err != nil {
			return res, err
		}
	}
	phase := atomic.Value{}
	phase.Store("catch-up")
	stop := rebuild.ReportProgress(r.log, r.cfg.ProgressEvery, r.cfg.Progress, func() (done, pending uint64) {
		for _, c := range copiers {
			done, pending = done+c.done.Load(), pending+c.pend.Load()
		}
		return done, pending
	}, &phase, start)
	defer stop()

	// Catch up twice: the second round is short, and so is the time the live projector
	// writes only into the old tables.
	for range 2 {
		g, gctx := errgroup.WithContext(ctx)
		for _, c := range copiers {
			g.Go(func() error { return r.copyToEnd(gctx, c, c.table.name+"_rebuild") })
		}
		if err := g.Wait(); err != nil {
			return res, err
		}
	}
	phase.Store("swap")
	suffix := "_old_" + rebuild.OldSuffix(time.Now())
	var renames []string
	for _, c := range copiers {
		n := c.table.name
		renames = append(renames, n+" TO "+n+suffix, n+"_rebuild TO "+n)
	}
	if err := r.ch.Exec(ctx, "RENAME TABLE "+strings.Join(renames, ", ")); err != nil {
		return res, fmt.Errorf("swap the rebuilt history tables in (run the rebuild again): %w", err)
	}
	// What the live projector wrote into the old tables before the rename.
	for _, c := range copiers {
		if err := r.copyToEnd(ctx, c, c.table.name); err != nil {
			return res, fmt.Errorf("after the swap (the new tables may miss rows up to now; run the rebuild again): %w", err)
		}
	}
	phase.Store("done")
	for _, c := range copiers {
		res.Applied += c.done.Load()
	}
	res.OldTable, res.Elapsed = suffix, time.Since(start)
	r.log.Info("history projection rebuilt and swapped in", "messages", res.Applied, "old_tables", "*"+suffix, "elapsed", res.Elapsed.Round(time.Millisecond))
	return res, nil
}

func (r *Rebuild) plan(ctx context.Context, c *copier) error {
	s, err := logread.StreamState(ctx, r.js, c.stream)
	if err != nil {
		return err
	}
	r.log.Info("stream holds", "stream", c.stream, "first_seq", s.FirstSeq, "last_seq", s.LastSeq, "messages", s.Msgs)
	if s.Msgs > 0 && s.FirstSeq > 1 {
		if r.cfg.FromSeq == 0 {
			return fmt.Errorf("%w: %s starts at sequence %d (%d messages removed by its limits); the rebuilt %s would lack them: pass --from-seq to accept that",
				rebuild.ErrLogTruncated, c.stream, s.FirstSeq, s.FirstSeq-1, c.table.name)
		}
		r.log.Warn("the stream no longer holds its start: the rebuilt table lacks it", "stream", c.stream, "first_seq", s.FirstSeq)
	}
	return nil
}

func (r *Rebuild) open(ctx context.Context, c *copier) error {
	start := uint64(1)
	if c.stream == natsx.ReadingsStream && r.cfg.FromSeq > 1 {
		start = r.cfg.FromSeq
	}
	var err error
	if c.cons, err = logread.New(ctx, r.js, c.stream, "", start); err != nil {
		return err
	}
	c.pend.Store(c.cons.Pending())
	return nil
}

// copyToEnd reads c's stream up to its last sequence as of now and inserts the rows into table.
func (r *Rebuild) copyToEnd(ctx context.Context, c *copier, table string) error {
	s, err := logread.StreamState(ctx, r.js, c.stream)
	if err != nil {
		return err
	}
	target := s.LastSeq
	t := c.table
	t.name = table
	var rows []any
	flush := func() error {
		if len(rows) == 0 {
			return nil
		}
		if err := insertRows(ctx, r.ch, t, t.columns(rows)); err != nil {
			return err
		}
		rows = rows[:0]
		return nil
	}
	for c.last < target {
		msgs, err := c.cons.Fetch(ctx, r.cfg.BatchSize, 0)
		if err != nil {
			return err
		}
		if len(msgs) == 0 {
			cinfo, err := c.cons.Info(ctx)
			if err != nil {
				return fmt.Errorf("%s consumer: %w", c.stream, err)
			}
			if cinfo.NumPending == 0 {
				break // the messages up to target are gone (deleted)
			}
			if !backoff.Sleep(ctx, 20*time.Millisecond) {
				return ctx.Err()
			}
			continue
		}
		for _, m := range msgs {
			md, err := m.Metadata()
			if err != nil {
				return fmt.Errorf("message metadata: %w", err)
			}
			c.last = md.Sequence.Stream
			c.pend.Store(md.NumPending)
			row, err := t.decode(m.Subject(), m.Data(), md, r.cfg.PartitionCount)
			if err != nil {
				continue // not a row, or one the live projector skips or sets aside as well
			}
			rows = append(rows, row)
		}
		c.done.Add(uint64(len(msgs)))
		if len(rows) >= r.cfg.BatchSize {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	return flush()
}

// DropOld drops the history tables earlier swaps replaced and returns their names.
func DropOld(ctx context.Context, ch driver.Conn) ([]string, error) {
	live := make([]string, len(tables))
	for i, t := range tables {
		live[i] = t.schema.Name // identifiers of chschema: nothing to quote
	}
	rows, err := ch.Query(ctx, fmt.Sprintf(`SELECT name FROM system.tables WHERE database = currentDatabase()
		AND match(name, '^(%s)_old_[0-9]+$') ORDER BY name`, strings.Join(live, "|")))
	if err != nil {
		return nil, fmt.Errorf("list old history tables: %w", err)
	}
	var names []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			rows.Close()
			return nil, fmt.Errorf("list old history tables: %w", err)
		}
		names = append(names, n)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list old history tables: %w", err)
	}
	for _, n := range names {
		if err := ch.Exec(ctx, "DROP TABLE "+n); err != nil {
			return nil, fmt.Errorf("drop %s: %w", n, err)
		}
	}
	return names, nil
}
