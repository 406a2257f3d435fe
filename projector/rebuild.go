package projector

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/lock-sensors/lock-sensors/internal/crashpoint"
	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
)

// The rebuild of the state projection: READINGS is applied again, with the very stateStep of
// the live projector, into a shadow table (its own checkpoints under StateRebuildProjection),
// while the live projection keeps serving and advancing. The shadow follows the live
// checkpoints, never the end of the log: every event it derives is then one the live
// projector has derived too, so each is checked against EVENTS (or the outbox, for those not
// relayed yet) and none is ever written to the outbox again (invariant 5). When the shadow
// is close behind, one transaction locks the live checkpoints and sensor_state, applies the
// tail, and renames the tables; the old table stays until DropOldState.

// Names of the state rebuild.
const (
	StateRebuildProjection = "state_rebuild"
	StateShadowTable       = "sensor_state_rebuild"
	StateOldTablePrefix    = "sensor_state_old_"
)

// CrashRebuildAfterBatch is hit after each committed batch of the shadow.
const CrashRebuildAfterBatch = "rebuild.after_batch"

var (
	// ErrLogTruncated: READINGS no longer holds the start of the log (stream limits).
	ErrLogTruncated = errors.New("READINGS no longer holds the start of the log")
	// ErrEventMismatch: an event the rebuild derived differs from the one already published
	// under its id, or is missing although the live projection is past it.
	ErrEventMismatch = errors.New("a re-derived event does not match EVENTS")
)

// RebuildConfig configures a rebuild of the state projection.
type RebuildConfig struct {
	// PartitionCount is LOCKS_PARTITIONS.
	PartitionCount int
	// FromSeq starts the rebuild at this READINGS sequence instead of 1. It is required when
	// the stream no longer starts at 1; the events of a rebuild that does not start at the
	// beginning get other revisions and will not match EVENTS.
	FromSeq uint64
	// BatchSize is the most READINGS messages per shadow transaction (default 5000).
	BatchSize int
	// SwapTail is how far (in stream sequences) the shadow may be behind the live checkpoint
	// of a partition when the swap transaction starts (default 20000): the tail is applied
	// while the live projector waits.
	SwapTail uint64
	// LockTimeout bounds the wait for the live tables' locks at the swap (default 30s).
	LockTimeout time.Duration
	// ProgressEvery is the period of Progress calls (default 1s).
	ProgressEvery time.Duration
	// Progress, when set, is called every ProgressEvery and once at the end; otherwise
	// progress is logged.
	Progress func(RebuildProgress)
}

func (c *RebuildConfig) setDefaults() {
	if c.BatchSize == 0 {
		c.BatchSize = 5000
	}
	if c.SwapTail == 0 {
		c.SwapTail = 20000
	}
	if c.LockTimeout == 0 {
		c.LockTimeout = 30 * time.Second
	}
	if c.ProgressEvery == 0 {
		c.ProgressEvery = time.Second
	}
}

// Validate reports the first bad field.
func (c RebuildConfig) Validate() error {
	switch {
	case c.PartitionCount < 1:
		return fmt.Errorf("rebuild: partition count %d < 1", c.PartitionCount)
	case c.BatchSize < 1 || c.BatchSize > 50000:
		return fmt.Errorf("rebuild: batch size %d not in 1..50000", c.BatchSize)
	case c.LockTimeout <= 0 || c.ProgressEvery <= 0:
		return errors.New("rebuild: lock timeout and progress period must be > 0")
	}
	return nil
}

// RebuildProgress is a rebuild's progress: Done of Total READINGS messages (Total moves
// with the log), Rate in messages/s since the start, ETA at that rate.
type RebuildProgress struct {
	Phase string // "catch-up", "swap" or "done"
	Done  uint64
	Total uint64
	Rate  float64
	ETA   time.Duration
}

// RebuildResult sums up a finished rebuild.
type RebuildResult struct {
	Applied uint64 // READINGS messages applied to the shadow by this run
	Resumed bool   // the shadow of an earlier, interrupted run was continued
	// EventsChecked matched EVENTS (or the live outbox); EventsUnverified could not be
	// checked because EVENTS no longer holds its start.
	EventsChecked, EventsUnverified int
	OldTable                        string // the replaced table, kept until DropOldState
	Elapsed                         time.Duration
}

// RebuildDeps are what a rebuild runs on.
type RebuildDeps struct {
	JS  jetstream.JetStream
	PG  *pgxpool.Pool
	Log *slog.Logger
}

// StateRebuild rebuilds the state projection; see the comment at the top of this file.
type StateRebuild struct {
	cfg RebuildConfig
	js  jetstream.JetStream
	pg  *pgxpool.Pool
	log *slog.Logger
	// pos is READINGS as plan found it: the shadow's checkpoints name its stream.
	pos streamPosition

	afterBatch func() // tests: called after each committed shadow batch
}

// NewStateRebuild checks the configuration.
func NewStateRebuild(cfg RebuildConfig, d RebuildDeps) (*StateRebuild, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if d.JS == nil || d.PG == nil || d.Log == nil {
		return nil, errors.New("rebuild: JS, PG and Log are required")
	}
	return &StateRebuild{cfg: cfg, js: d.JS, pg: d.PG, log: d.Log.With("part", "rebuild", "projection", StateProjection)}, nil
}

// Run rebuilds the state projection and swaps it in. Stopped (ctx) or failed, it leaves the
// shadow and its checkpoints consistent, and the next Run continues from them.
func (r *StateRebuild) Run(ctx context.Context) (RebuildResult, error) {
	start := time.Now()
	var res RebuildResult
	eventsTruncated, err := r.plan(ctx)
	if err != nil {
		return res, err
	}
	if res.Resumed, err = r.prepareShadow(ctx); err != nil {
		return res, err
	}
	workers := make([]*rebuildWorker, r.cfg.PartitionCount)
	for p := range workers {
		w := &rebuildWorker{r: r, p: p, rows: map[string]stateRow{},
			check: &eventChecker{pg: r.pg, p: p, seen: map[string][]byte{}, truncated: eventsTruncated}}
		workers[p] = w
		defer w.close(ctx)
		if err := w.open(ctx); err != nil {
			return res, err
		}
	}
	phase := atomic.Value{}
	phase.Store("catch-up")
	stopProgress := reportProgress(r.log, r.cfg.ProgressEvery, r.cfg.Progress, func() (done, pending uint64) {
		for _, w := range workers {
			done, pending = done+w.done.Load(), pending+w.pending.Load()
		}
		return done, pending
	}, &phase, start)
	defer stopProgress()

	g, gctx := errgroup.WithContext(ctx)
	for _, w := range workers {
		g.Go(func() error { return w.follow(gctx) })
	}
	if err := g.Wait(); err != nil {
		return res, err
	}
	phase.Store("swap")
	if res.OldTable, err = r.swap(ctx, workers); err != nil {
		return res, err
	}
	phase.Store("done")
	for _, w := range workers {
		res.Applied += w.done.Load()
		res.EventsChecked += w.check.checked
		res.EventsUnverified += w.check.unverified
	}
	res.Elapsed = time.Since(start)
	r.log.Info("state projection rebuilt and swapped in", "applied", res.Applied, "events_checked", res.EventsChecked,
		"events_unverified", res.EventsUnverified, "old_table", res.OldTable, "elapsed", res.Elapsed.Round(time.Millisecond))
	return res, nil
}

// plan says, before anything is written, what the streams no longer hold.
func (r *StateRebuild) plan(ctx context.Context) (eventsTruncated bool, _ error) {
	var err error
	if r.pos, err = readingsPosition(ctx, r.js); err != nil {
		return false, err
	}
	// The shadow follows the live checkpoints: ones of another stream (or ahead of this one)
	// can never be reached, and the live projector refuses them anyway.
	bad, err := mismatchedCheckpoints(ctx, r.pg, StateProjection, r.pos, false)
	if err != nil {
		return false, err
	}
	if len(bad) > 0 {
		return false, fmt.Errorf("%d partition(s) of the live projection cannot be followed, first %w; %s", len(bad), bad[0], bad[0].WayOut())
	}
	s, err := streamState(ctx, r.js, natsx.ReadingsStream)
	if err != nil {
		return false, err
	}
	r.log.Info("READINGS holds", "first_seq", s.FirstSeq, "last_seq", s.LastSeq, "messages", s.Msgs, "deleted", s.NumDeleted)
	if s.Msgs > 0 && s.FirstSeq > 1 {
		if r.cfg.FromSeq == 0 {
			return false, fmt.Errorf("%w: it starts at sequence %d (%d messages removed by its limits); a rebuild would lose them: pass --from-seq to accept that",
				ErrLogTruncated, s.FirstSeq, s.FirstSeq-1)
		}
		r.log.Warn("READINGS no longer holds its start: the rebuild begins where it can", "first_seq", s.FirstSeq, "from_seq", max(r.cfg.FromSeq, s.FirstSeq))
	}
	if s.NumDeleted > 0 {
		r.log.Warn("READINGS has deleted messages inside its range: the rebuild cannot apply them", "deleted", s.NumDeleted)
	}
	es, err := streamState(ctx, r.js, natsx.EventsStream)
	if err != nil {
		return false, err
	}
	if es.Msgs > 0 && es.FirstSeq > 1 {
		r.log.Warn("EVENTS no longer holds its start: re-derived events it lost cannot be checked and are counted as unverified",
			"first_seq", es.FirstSeq)
		return true, nil
	}
	return false, nil
}

// prepareShadow creates the shadow table like sensor_state, or keeps the one an interrupted
// run left (resumed true).
func (r *StateRebuild) prepareShadow(ctx context.Context) (resumed bool, _ error) {
	err := pgx.BeginFunc(ctx, r.pg, func(tx pgx.Tx) error {
		// One rebuild at a time: a second one waits here, and then continues the shadow.
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('locks.rebuild.state'))`); err != nil {
			return fmt.Errorf("rebuild lock: %w", err)
		}
		var exists bool
		if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, StateShadowTable).Scan(&exists); err != nil {
			return fmt.Errorf("look up %s: %w", StateShadowTable, err)
		}
		if exists {
			bad, err := mismatchedCheckpoints(ctx, tx, StateRebuildProjection, r.pos, false)
			if err != nil {
				return err
			}
			if len(bad) == 0 {
				resumed = true
				return nil
			}
			// Continuing it would skip readings of this stream; it is only derived.
			r.log.Warn("the shadow of an interrupted rebuild was made from another READINGS stream: starting over", "reason", bad[0].Error())
			if _, err := tx.Exec(ctx, `DROP TABLE `+StateShadowTable); err != nil {
				return fmt.Errorf("drop %s: %w", StateShadowTable, err)
			}
		}
		var opts string
		if err := tx.QueryRow(ctx, `SELECT coalesce(array_to_string(reloptions, ', '), '') FROM pg_class WHERE oid = 'sensor_state'::regclass`).Scan(&opts); err != nil {
			return fmt.Errorf("sensor_state storage options: %w", err)
		}
		stmts := []string{
			`CREATE TABLE ` + StateShadowTable + ` (LIKE sensor_state INCLUDING ALL)`,
			`DELETE FROM checkpoints WHERE projection = '` + StateRebuildProjection + `'`,
		}
		if opts != "" {
			stmts = append(stmts, `ALTER TABLE `+StateShadowTable+` SET (`+opts+`)`)
		}
		for _, q := range stmts {
			if _, err := tx.Exec(ctx, q); err != nil {
				return fmt.Errorf("create %s: %w", StateShadowTable, err)
			}
		}
		return nil
	})
	if err != nil {
		return false, err
	}
	if resumed {
		r.log.Info("continuing the shadow of an interrupted rebuild", "table", StateShadowTable)
	}
	return resumed, nil
}

// readCheckpoints reads projection's checkpoints by partition, locking their rows when lock
// is set (in partition order).
func readCheckpoints(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, projection string, lock bool) (map[int]uint64, error) {
	sql := `SELECT partition, seq FROM checkpoints WHERE projection = $1 ORDER BY partition`
	if lock {
		sql += ` FOR UPDATE`
	}
	rows, err := q.Query(ctx, sql, projection)
	if err != nil {
		return nil, fmt.Errorf("read %s checkpoints: %w", projection, err)
	}
	out := map[int]uint64{}
	for rows.Next() {
		var p int
		var seq int64
		if err := rows.Scan(&p, &seq); err != nil {
			rows.Close()
			return nil, fmt.Errorf("scan %s checkpoint: %w", projection, err)
		}
		out[p] = uint64(seq)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read %s checkpoints: %w", projection, err)
	}
	return out, nil
}

// swap applies the tail and renames the tables in one transaction, holding the live
// checkpoints (in partition order, as the projector takes them one at a time: no deadlock)
// and sensor_state against writes.
func (r *StateRebuild) swap(ctx context.Context, workers []*rebuildWorker) (string, error) {
	old := StateOldTablePrefix + oldSuffix(time.Now())
	err := pgx.BeginFunc(ctx, r.pg, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = `+strconv.FormatInt(r.cfg.LockTimeout.Milliseconds(), 10)); err != nil {
			return fmt.Errorf("lock timeout: %w", err)
		}
		// Every partition's checkpoint row exists before the rows are locked: a live batch of
		// a partition without one would otherwise not wait for the swap, read the old table,
		// and then write into it after the rename. Uncommitted, these rows hold such a batch
		// at its own insert of the row.
		if _, err := tx.Exec(ctx, `INSERT INTO checkpoints (projection, partition, seq)
			SELECT $1, g, 0 FROM generate_series(0, $2::int - 1) AS g ON CONFLICT DO NOTHING`, StateProjection, r.cfg.PartitionCount); err != nil {
			return fmt.Errorf("live checkpoint rows: %w", err)
		}
		live, err := readCheckpoints(ctx, tx, StateProjection, true)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `LOCK TABLE sensor_state IN EXCLUSIVE MODE`); err != nil {
			return fmt.Errorf("lock sensor_state: %w", err)
		}
		inTx := func(_ context.Context, f func(pgx.Tx) error) error { return f(tx) }
		for _, w := range workers {
			if err := w.applyUpTo(ctx, live[w.p], inTx); err != nil {
				return fmt.Errorf("tail of partition %d: %w", w.p, err)
			}
		}
		renames, err := indexRenames(ctx, tx, old)
		if err != nil {
			return err
		}
		stmts := append(renames,
			`ALTER TABLE sensor_state RENAME TO `+old,
			`ALTER TABLE `+StateShadowTable+` RENAME TO sensor_state`,
			`DELETE FROM checkpoints WHERE projection = '`+StateRebuildProjection+`'`)
		for _, q := range stmts {
			if _, err := tx.Exec(ctx, q); err != nil {
				return fmt.Errorf("swap (%s): %w", q, err)
			}
		}
		return nil
	})
	if err != nil {
		// The shadow's rows in memory may be ahead of the rolled-back tail: a new Run
		// continues from the committed shadow.
		return "", fmt.Errorf("swap the rebuilt state projection in (run the rebuild again to continue): %w", err)
	}
	return old, nil
}

// indexRenames gives the live indexes names of the old table, and the shadow's indexes
// (named by LIKE) the live names, matching them by definition.
func indexRenames(ctx context.Context, tx pgx.Tx, old string) ([]string, error) {
	list := func(table string) (map[string]string, error) {
		rows, err := tx.Query(ctx, `SELECT c.relname, i.indisprimary::text || i.indisunique::text || regexp_replace(pg_get_indexdef(i.indexrelid), '^.* USING ', '')
			FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = $1::regclass`, table)
		if err != nil {
			return nil, fmt.Errorf("indexes of %s: %w", table, err)
		}
		byDef := map[string]string{}
		for rows.Next() {
			var name, def string
			if err := rows.Scan(&name, &def); err != nil {
				rows.Close()
				return nil, fmt.Errorf("indexes of %s: %w", table, err)
			}
			byDef[def] = name
		}
		rows.Close()
		return byDef, rows.Err()
	}
	live, err := list("sensor_state")
	if err != nil {
		return nil, err
	}
	shadow, err := list(StateShadowTable)
	if err != nil {
		return nil, err
	}
	var out []string
	for def, name := range live {
		sname, ok := shadow[def]
		if !ok {
			return nil, fmt.Errorf("index %s of sensor_state has no twin in %s: the table changed during the rebuild", name, StateShadowTable)
		}
		oldName := old + strings.TrimPrefix(name, "sensor_state")
		if len(oldName) > 63 {
			oldName = oldName[:63]
		}
		out = append(out, `ALTER INDEX `+pgx.Identifier{name}.Sanitize()+` RENAME TO `+pgx.Identifier{oldName}.Sanitize(),
			`ALTER INDEX `+pgx.Identifier{sname}.Sanitize()+` RENAME TO `+pgx.Identifier{name}.Sanitize())
	}
	// All old names first: a shadow index must not take a name still in use.
	var first, second []string
	for i, s := range out {
		if i%2 == 0 {
			first = append(first, s)
		} else {
			second = append(second, s)
		}
	}
	return append(first, second...), nil
}

// oldSuffix names the tables a swap replaces by the time, to the millisecond, in an order
// that sorts.
func oldSuffix(t time.Time) string {
	t = t.UTC()
	return t.Format("20060102150405") + fmt.Sprintf("%03d", t.Nanosecond()/1e6)
}

// DropOldState drops the tables earlier swaps replaced and returns their names.
func DropOldState(ctx context.Context, pg *pgxpool.Pool) ([]string, error) {
	rows, err := pg.Query(ctx, `SELECT tablename FROM pg_tables WHERE schemaname = current_schema() AND tablename LIKE $1 ORDER BY tablename`,
		strings.ReplaceAll(StateOldTablePrefix, "_", `\_`)+"%")
	if err != nil {
		return nil, fmt.Errorf("list old state tables: %w", err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("list old state tables: %w", err)
	}
	for _, n := range names {
		if _, err := pg.Exec(ctx, `DROP TABLE `+pgx.Identifier{n}.Sanitize()); err != nil {
			return nil, fmt.Errorf("drop %s: %w", n, err)
		}
	}
	return names, nil
}

// reportProgress calls progress (or, when it is nil, logs) every period and once at stop,
// with the counts of messages done and pending that counts sums up.
func reportProgress(log *slog.Logger, period time.Duration, progress func(RebuildProgress), counts func() (done, pending uint64),
	phase *atomic.Value, start time.Time) (stop func()) {
	snapshot := func() RebuildProgress {
		var pr RebuildProgress
		d, p := counts()
		pr.Done, pr.Total = d, d+p
		pr.Phase = phase.Load().(string)
		if el := time.Since(start).Seconds(); el > 0 {
			pr.Rate = float64(pr.Done) / el
		}
		if pr.Rate > 0 {
			pr.ETA = time.Duration(float64(pr.Total-pr.Done) / pr.Rate * float64(time.Second))
		}
		return pr
	}
	emit := func() {
		pr := snapshot()
		if progress != nil {
			progress(pr)
			return
		}
		log.Info("rebuild progress", "phase", pr.Phase, "done", pr.Done, "total", pr.Total,
			"per_second", int64(pr.Rate), "eta", pr.ETA.Round(time.Second))
	}
	quit, finished := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			select {
			case <-quit:
				emit()
				return
			case <-t.C:
				emit()
			}
		}
	}()
	return func() { close(quit); <-finished }
}

// rebuildWorker applies one partition to the shadow. Its rows are the shadow's rows of the
// partition as last committed; cp is the last sequence committed, pos the sequence up to
// which the partition is known applied (beyond cp when the next message is further on).
type rebuildWorker struct {
	r       *StateRebuild
	p       int
	rows    map[string]stateRow
	cp, pos uint64
	cons    *logReader
	held    []jetstream.Msg // fetched, beyond the target
	check   *eventChecker
	done    atomic.Uint64
	pending atomic.Uint64
}

// open loads the shadow's rows and checkpoint of the partition and opens a logReader on
// the partition right after it (and one on its EVENTS, for the checks).
func (w *rebuildWorker) open(ctx context.Context) error {
	r := w.r
	var cp int64
	err := r.pg.QueryRow(ctx, `SELECT seq FROM checkpoints WHERE projection = $1 AND partition = $2`, StateRebuildProjection, w.p).Scan(&cp)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("rebuild checkpoint of partition %d: %w", w.p, err)
	}
	w.cp, w.pos = uint64(cp), uint64(cp)
	rows, err := r.pg.Query(ctx, `SELECT sensor_id, data, last_seen, last_reading_time, changed_at, revision, connection, last_seq
		FROM `+StateShadowTable+` WHERE partition = $1`, w.p)
	if err != nil {
		return fmt.Errorf("load %s: %w", StateShadowTable, err)
	}
	if err := scanStateRows(rows, w.rows); err != nil {
		return err
	}
	startSeq := max(w.cp+1, r.cfg.FromSeq, 1)
	w.cons, err = newLogReader(ctx, r.js, natsx.ReadingsStream, natsx.ReadingsPartitionFilter(w.p), startSeq)
	if err != nil {
		return fmt.Errorf("READINGS of partition %d: %w", w.p, err)
	}
	w.pending.Store(w.cons.pending())
	w.check.cons, err = newLogReader(ctx, r.js, natsx.EventsStream, natsx.EventsPartitionFilter(w.p), 1)
	if err != nil {
		return fmt.Errorf("EVENTS of partition %d: %w", w.p, err)
	}
	return nil
}

// close deletes the worker's consumers.
func (w *rebuildWorker) close(ctx context.Context) {
	if w.cons != nil {
		w.cons.close(ctx)
	}
	if w.check != nil && w.check.cons != nil {
		w.check.cons.close(ctx)
	}
}

// follow applies the partition up to the live checkpoint, again and again, until it is
// within SwapTail of it.
func (w *rebuildWorker) follow(ctx context.Context) error {
	inPool := func(ctx context.Context, f func(pgx.Tx) error) error { return pgx.BeginFunc(ctx, w.r.pg, f) }
	for {
		live, err := readCheckpoints(ctx, w.r.pg, StateProjection, false)
		if err != nil {
			return err
		}
		target := live[w.p]
		if target < w.cp {
			return fmt.Errorf("partition %d: the shadow (seq %d) is ahead of the live projection (seq %d): was the live checkpoint reset?", w.p, w.cp, target)
		}
		if target <= w.pos || target-w.pos <= w.r.cfg.SwapTail {
			return nil
		}
		if err := w.applyUpTo(ctx, target, inPool); err != nil {
			return err
		}
	}
}

// applyUpTo applies the partition's messages up to seq target, one transaction (run by
// inTx) per batch.
func (w *rebuildWorker) applyUpTo(ctx context.Context, target uint64, inTx func(context.Context, func(pgx.Tx) error) error) error {
	for w.pos < target {
		if err := ctx.Err(); err != nil {
			return err
		}
		msgs := w.held
		w.held = nil
		if len(msgs) == 0 {
			var err error
			if msgs, err = w.fetch(ctx); err != nil {
				return err
			}
		}
		cut := len(msgs)
		for i, m := range msgs {
			md, err := m.Metadata()
			if err != nil {
				return fmt.Errorf("message metadata: %w", err)
			}
			if md.Sequence.Stream > target {
				cut = i
				break
			}
		}
		if cut < len(msgs) {
			w.held = msgs[cut:]
		}
		if cut > 0 {
			if err := w.apply(ctx, msgs[:cut], inTx); err != nil {
				return err
			}
		}
		if len(w.held) > 0 {
			// The partition's next message is past the target: applied up to it.
			w.pos = target
		}
	}
	return nil
}

func (w *rebuildWorker) fetch(ctx context.Context) ([]jetstream.Msg, error) {
	msgs, err := w.cons.fetch(ctx, w.r.cfg.BatchSize, 0)
	if err == nil && len(msgs) == 0 {
		msgs, err = w.cons.fetch(ctx, w.r.cfg.BatchSize, 200*time.Millisecond)
	}
	if err != nil {
		return nil, fmt.Errorf("fetch READINGS partition %d: %w", w.p, err)
	}
	return msgs, nil
}

// apply decides msgs with stateStep, checks the events against EVENTS and writes the
// changed rows and the checkpoint in one transaction.
func (w *rebuildWorker) apply(ctx context.Context, msgs []jetstream.Msg, inTx func(context.Context, func(pgx.Tx) error) error) error {
	changed := map[string]stateRow{}
	var order []string
	var evs []event.Event
	var last uint64
	var pending uint64
	for _, m := range msgs {
		md, err := m.Metadata()
		if err != nil {
			return fmt.Errorf("message metadata: %w", err)
		}
		last, pending = md.Sequence.Stream, md.NumPending
		l, err := prepareLog(m.Subject(), m.Data(), w.r.cfg.PartitionCount)
		if err != nil {
			continue // set aside by the live projector
		}
		cur, ok := changed[l.SensorID]
		if !ok {
			cur, ok = w.rows[l.SensorID]
		} else {
			ok = true
		}
		var touched bool
		cur, touched, evs = stateStep(cur, ok, l, w.p, last, evs)
		if touched {
			if _, seen := changed[l.SensorID]; !seen {
				order = append(order, l.SensorID)
			}
			changed[l.SensorID] = cur
		}
	}
	var bad []error
	for _, e := range evs {
		if err := w.check.check(ctx, e); err != nil {
			if errors.Is(err, ErrEventMismatch) {
				bad = append(bad, err)
				continue
			}
			return err
		}
	}
	if len(bad) > 0 {
		for i, err := range bad {
			if i < 5 {
				w.r.log.Error("re-derived event does not match", "partition", w.p, "err", err)
			}
		}
		return fmt.Errorf("partition %d, READINGS up to seq %d: %d events: %w", w.p, last, len(bad), bad[0])
	}
	// Rows in w.rows are in the shadow (committed): updated in place (HOT, as the live
	// projector does), the others inserted.
	var upd, ins stateColumns
	for _, id := range order {
		if _, ok := w.rows[id]; ok {
			upd.add(id, w.p, changed[id])
		} else {
			ins.add(id, w.p, changed[id])
		}
	}
	err := inTx(ctx, func(tx pgx.Tx) error {
		b := &pgx.Batch{}
		queueStateRows(b, StateShadowTable, &upd, &ins)
		b.Queue(`INSERT INTO checkpoints (projection, partition, seq, stream) VALUES ($1, $2, $3, $4)
			ON CONFLICT (projection, partition) DO UPDATE SET seq = excluded.seq, stream = excluded.stream, updated_at = now()`,
			StateRebuildProjection, w.p, int64(last), w.r.pos.id)
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return fmt.Errorf("write %s: %w", StateShadowTable, err)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("partition %d batch up to seq %d: %w", w.p, last, err)
	}
	crashpoint.Hit(CrashRebuildAfterBatch)
	if w.r.afterBatch != nil {
		w.r.afterBatch()
	}
	for id, row := range changed {
		w.rows[id] = row
	}
	w.cp, w.pos = last, last
	w.done.Add(uint64(len(msgs)))
	w.pending.Store(pending)
	return nil
}

// eventChecker holds the events of one partition read from EVENTS and not matched yet.
type eventChecker struct {
	pg        *pgxpool.Pool
	p         int
	cons      *logReader
	seen      map[string][]byte // event id → payload
	truncated bool              // EVENTS no longer holds its start

	checked, unverified int
}

// drain reads EVENTS on until it has read the event id (or the end): the relay publishes a
// partition's events in the order they were derived, so only a short window is held.
func (c *eventChecker) drain(ctx context.Context, id string) error {
	for {
		if _, ok := c.seen[id]; ok {
			return nil
		}
		msgs, err := c.cons.fetch(ctx, 1000, 0)
		if err != nil {
			return fmt.Errorf("read EVENTS partition %d: %w", c.p, err)
		}
		for _, m := range msgs {
			mid := m.Headers().Get(jetstream.MsgIDHeader)
			if mid == "" {
				ev, err := event.DecodeEvent(m.Data())
				if err != nil {
					continue
				}
				mid = ev.ID
			}
			c.seen[mid] = m.Data()
		}
		if len(msgs) == 0 {
			return ctx.Err()
		}
	}
}

// check matches e against what was published (or is about to be, in the live outbox) under
// its id. An event found nowhere is fine only when the live projection has not reached its
// revision, which the swap's tail would otherwise contradict.
func (c *eventChecker) check(ctx context.Context, e event.Event) error {
	want, err := json.Marshal(e)
	if err != nil {
		return fmt.Errorf("encode event: %w", err)
	}
	match := func(have []byte, where string) error {
		c.checked++
		if sameEvent(have, want) {
			return nil
		}
		return fmt.Errorf("%w: %s in %s is %s, the rebuild derives %s", ErrEventMismatch, e.ID, where, have, want)
	}
	lookup := func() ([]byte, bool) {
		b, ok := c.seen[e.ID]
		if ok {
			delete(c.seen, e.ID)
		}
		return b, ok
	}
	if b, ok := lookup(); ok {
		return match(b, "EVENTS")
	}
	if err := c.drain(ctx, e.ID); err != nil {
		return err
	}
	if b, ok := lookup(); ok {
		return match(b, "EVENTS")
	}
	var payload []byte
	err = c.pg.QueryRow(ctx, `SELECT payload FROM outbox WHERE event_id = $1`, e.ID).Scan(&payload)
	if err == nil {
		return match(payload, "the outbox")
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("look up event %s in the outbox: %w", e.ID, err)
	}
	// The relay may have published and deleted it meanwhile: it publishes first.
	if err := c.drain(ctx, e.ID); err != nil {
		return err
	}
	if b, ok := lookup(); ok {
		return match(b, "EVENTS")
	}
	var rev int64
	err = c.pg.QueryRow(ctx, `SELECT revision FROM sensor_state WHERE sensor_id = $1`, e.SensorID).Scan(&rev)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("live revision of %s: %w", e.SensorID, err)
	}
	switch {
	case rev < e.Revision:
		return nil // newer than the live projection: it derives and publishes it itself
	case c.truncated:
		c.unverified++
		return nil
	}
	return fmt.Errorf("%w: %s (sensor %s revision %d) is in neither EVENTS nor the outbox, but the live projection is at revision %d",
		ErrEventMismatch, e.ID, e.SensorID, e.Revision, rev)
}

// sameEvent compares an event as stored with one as encoded here, through one decoding so
// that only content counts.
func sameEvent(stored, want []byte) bool {
	if bytes.Equal(stored, want) {
		return true
	}
	ev, err := event.DecodeEvent(stored)
	if err != nil {
		return false
	}
	b, err := json.Marshal(ev)
	return err == nil && bytes.Equal(b, want)
}
