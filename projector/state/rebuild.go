package state

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/lock-sensors/lock-sensors/internal/logread"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/part"
	"github.com/lock-sensors/lock-sensors/internal/rebuild"
)

// The rebuild of the state projection: READINGS is applied again, with the very step of
// the live projector, into a shadow table (its own checkpoints under ShadowName),
// while the live projection keeps serving and advancing. The shadow follows the live
// checkpoints, never the end of the log: every event it derives is then one the live
// projector has derived too, so each is checked against EVENTS (or the outbox, for those not
// relayed yet) and none is ever written to the outbox again (invariant 5). When the shadow
// is close behind, one transaction locks the live checkpoints and sensor_state, applies the
// tail, and renames the tables; the old table stays until DropOld.

// Names of the state rebuild.
const (
	ShadowName     = "state_rebuild"
	ShadowTable    = "sensor_state_rebuild"
	OldTablePrefix = "sensor_state_old_"
)

// CrashRebuildAfterBatch is hit after each committed batch of the shadow.
const CrashRebuildAfterBatch = "rebuild.after_batch"

var (
	// ErrEventMismatch: an event the rebuild derived differs from the one already published
	// under its id, or is missing although the live projection is past it.
	ErrEventMismatch = errors.New("a re-derived event does not match EVENTS")
)

// RebuildDeps are what a rebuild runs on.
type RebuildDeps struct {
	Logger *slog.Logger
	JS     jetstream.JetStream
	PG     *pgxpool.Pool
}

// Rebuild rebuilds the state projection; see the comment at the top of this file.
type Rebuild struct {
	cfg RebuildConfig
	js  jetstream.JetStream
	pg  *pgxpool.Pool
	log *slog.Logger
	// pos is READINGS as plan found it: the shadow's checkpoints name its stream.
	pos streamPosition
	// renumbered: READINGS no longer holds its start (plan), so the shadow's revisions
	// count from each sensor's first kept reading and the swap continues the live ones.
	renumbered bool

	afterBatch func()      // tests: called after each committed shadow batch
	swapFailed func(error) // tests: called when a swap attempt fails
}

// NewRebuild checks the configuration.
func NewRebuild(cfg RebuildConfig, d RebuildDeps) (*Rebuild, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := part.Require("state rebuild", part.Dep{Name: "Logger", Value: d.Logger}, part.Dep{Name: "JS", Value: d.JS},
		part.Dep{Name: "PG", Value: d.PG}); err != nil {
		return nil, err
	}
	return &Rebuild{cfg: cfg, js: d.JS, pg: d.PG, log: d.Logger.With("part", "rebuild", "projection", Name)}, nil
}

// Run rebuilds the state projection and swaps it in. Stopped (ctx) or failed, it leaves the
// shadow and its checkpoints consistent, and the next Run continues from them.
func (r *Rebuild) Run(ctx context.Context) (rebuild.Result, error) {
	start := time.Now()
	var res rebuild.Result
	eventsTruncated, err := r.plan(ctx)
	if err != nil {
		return res, err
	}
	if res.Resumed, err = r.prepareShadow(ctx); err != nil {
		return res, err
	}
	var cur atomic.Pointer[[]*shadowWorker]
	defer func() {
		if ws := cur.Load(); ws != nil {
			closeWorkers(ctx, *ws)
		}
	}()
	var earlier shadowCounts // of the workers of earlier swap attempts
	var sweepPending atomic.Uint64
	phase := atomic.Value{}
	phase.Store("catch-up")
	stopProgress := rebuild.ReportProgress(r.log, r.cfg.ProgressEvery, r.cfg.Progress, func() (done, pending uint64) {
		done, pending = earlier.done.Load(), sweepPending.Load()
		if ws := cur.Load(); ws != nil {
			for _, w := range *ws {
				done, pending = done+w.done.Load(), pending+w.pending.Load()
			}
		}
		return done, pending
	}, &phase, start)
	defer stopProgress()

	for attempt := 1; ; attempt++ {
		workers, err := r.openWorkers(ctx, eventsTruncated)
		cur.Store(&workers)
		if err != nil {
			return res, err
		}
		if err := r.sweep(ctx, workers, &sweepPending); err != nil {
			return res, err
		}
		g, gctx := errgroup.WithContext(ctx)
		for _, w := range workers {
			g.Go(func() error { return w.follow(gctx) })
		}
		if err := g.Wait(); err != nil {
			return res, err
		}
		phase.Store("swap")
		res.OldTable, err = r.swap(ctx, workers)
		if err == nil {
			earlier.add(workers)
			cur.Store(nil)
			closeWorkers(ctx, workers)
			break
		}
		if r.swapFailed != nil {
			r.swapFailed(err)
		}
		if attempt == swapAttempts || !lockConflict(err) || ctx.Err() != nil {
			return res, err
		}
		// A deadlock with a live batch (which Postgres resolves by failing one of the two) or
		// the lock timeout: the tail rolled back, so continue from the committed shadow.
		r.log.Warn("the swap met the live projector's locks: catching up again and retrying", "attempt", attempt, "err", err)
		earlier.add(workers)
		cur.Store(nil)
		closeWorkers(ctx, workers)
		phase.Store("catch-up")
	}
	phase.Store("done")
	res.Applied = earlier.done.Load()
	res.EventsChecked, res.EventsUnverified = earlier.checked, earlier.unverified
	res.Elapsed = time.Since(start)
	r.log.Info("state projection rebuilt and swapped in", "applied", res.Applied, "events_checked", res.EventsChecked,
		"events_unverified", res.EventsUnverified, "old_table", res.OldTable, "elapsed", res.Elapsed.Round(time.Millisecond))
	return res, nil
}

// inPool runs f in a transaction of its own on the pool: how a shadow batch is written
// outside the swap (which writes the tail in its own transaction).
func (r *Rebuild) inPool(ctx context.Context, f func(pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, r.pg, f)
}

// swapAttempts bounds the swaps tried when the live projector's locks get in the way.
const swapAttempts = 5

// openWorkers opens a shadow worker per partition at the shadow's committed checkpoint.
func (r *Rebuild) openWorkers(ctx context.Context, eventsTruncated bool) ([]*shadowWorker, error) {
	workers := make([]*shadowWorker, 0, r.cfg.PartitionCount)
	for p := range r.cfg.PartitionCount {
		w := &shadowWorker{r: r, p: p, rows: map[string]row{},
			check: &eventChecker{pg: r.pg, p: p, seen: map[string][]byte{}, truncated: eventsTruncated, renumbered: r.renumbered}}
		workers = append(workers, w)
		if err := w.open(ctx); err != nil {
			return workers, err
		}
	}
	return workers, nil
}

func closeWorkers(ctx context.Context, workers []*shadowWorker) {
	for _, w := range workers {
		w.close(ctx)
	}
}

// shadowCounts sums what the workers of finished attempts did.
type shadowCounts struct {
	done                atomic.Uint64
	checked, unverified int
}

func (c *shadowCounts) add(workers []*shadowWorker) {
	for _, w := range workers {
		c.done.Add(w.done.Load())
		c.checked += w.check.checked
		c.unverified += w.check.unverified
	}
}

// lockConflict reports a deadlock or a lock wait past lock_timeout.
func lockConflict(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "40P01" || pe.Code == "55P03") // deadlock_detected, lock_not_available
}

// plan says, before anything is written, what the streams no longer hold.
func (r *Rebuild) plan(ctx context.Context) (eventsTruncated bool, _ error) {
	var err error
	if r.pos, err = readingsPosition(ctx, r.js); err != nil {
		return false, err
	}
	// The shadow follows the live checkpoints: ones of another stream (or ahead of this one)
	// can never be reached, and the live projector refuses them anyway.
	bad, err := mismatchedCheckpoints(ctx, r.pg, r.js, Name, r.pos, false)
	if err != nil {
		return false, err
	}
	if len(bad) > 0 {
		return false, fmt.Errorf("%d partition(s) of the live projection cannot be followed, first %w; %s", len(bad), bad[0], bad[0].WayOut())
	}
	s, err := logread.StreamState(ctx, r.js, natsx.ReadingsStream)
	if err != nil {
		return false, err
	}
	r.log.Info("READINGS holds", "first_seq", s.FirstSeq, "last_seq", s.LastSeq, "messages", s.Msgs, "deleted", s.NumDeleted)
	if s.Msgs > 0 && s.FirstSeq > 1 {
		if r.cfg.FromSeq == 0 {
			return false, fmt.Errorf("%w: it starts at sequence %d (%d messages removed by its limits); a rebuild would lose them: pass --from-seq to accept that",
				rebuild.ErrLogTruncated, s.FirstSeq, s.FirstSeq-1)
		}
		r.log.Warn("READINGS no longer holds its start: the rebuild begins where it can, and continues each sensor's revisions from the live projection",
			"first_seq", s.FirstSeq, "from_seq", max(r.cfg.FromSeq, s.FirstSeq))
	}
	if r.renumbered = s.Msgs > 0 && max(s.FirstSeq, r.cfg.FromSeq) > 1; r.renumbered {
		// The revisions of the readings no longer kept survive only in the live rows: without
		// them the rebuild would number revisions from 1 again, and new events would reuse ids
		// that receivers have already de-duplicated.
		var live int64
		if err := r.pg.QueryRow(ctx, `SELECT count(*) FROM sensor_state`).Scan(&live); err != nil {
			return false, fmt.Errorf("count sensor_state: %w", err)
		}
		es, err := logread.StreamState(ctx, r.js, natsx.EventsStream)
		if err != nil {
			return false, err
		}
		// Without events published, no receiver has seen an id that could come again.
		if live == 0 && es.LastSeq > 0 {
			return false, fmt.Errorf("%w: READINGS starts at sequence %d and sensor_state is empty, so the sensors' revisions so far are known nowhere; "+
				"a rebuild would number them from 1 again and reuse event ids that receivers have already seen: restore sensor_state from a backup first",
				rebuild.ErrLogTruncated, s.FirstSeq)
		}
	}
	if s.NumDeleted > 0 {
		r.log.Warn("READINGS has deleted messages inside its range: the rebuild cannot apply them", "deleted", s.NumDeleted)
	}
	es, err := logread.StreamState(ctx, r.js, natsx.EventsStream)
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
func (r *Rebuild) prepareShadow(ctx context.Context) (resumed bool, _ error) {
	err := pgx.BeginFunc(ctx, r.pg, func(tx pgx.Tx) error {
		// One rebuild at a time: a second one waits here, and then continues the shadow.
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('locks.rebuild.state'))`); err != nil {
			return fmt.Errorf("rebuild lock: %w", err)
		}
		var exists, sameShape bool
		// A shadow left from before sensor_state was partitioned (or the reverse) cannot be swapped in.
		if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL, coalesce((SELECT relkind FROM pg_class WHERE oid = to_regclass($1)) =
			(SELECT relkind FROM pg_class WHERE oid = 'sensor_state'::regclass), false)`, ShadowTable).Scan(&exists, &sameShape); err != nil {
			return fmt.Errorf("look up %s: %w", ShadowTable, err)
		}
		if exists && !sameShape {
			r.log.Warn("the shadow of an interrupted rebuild is not partitioned as sensor_state now is: starting over")
			if _, err := tx.Exec(ctx, `DROP TABLE `+ShadowTable); err != nil {
				return fmt.Errorf("drop %s: %w", ShadowTable, err)
			}
			exists = false
		}
		if exists {
			bad, err := mismatchedCheckpoints(ctx, tx, r.js, ShadowName, r.pos, false)
			if err != nil {
				return err
			}
			if len(bad) == 0 {
				resumed = true
				return nil
			}
			// Continuing it would skip readings of this stream; it is only derived.
			r.log.Warn("the shadow of an interrupted rebuild was made from another READINGS stream: starting over", "reason", bad[0].Error())
			if _, err := tx.Exec(ctx, `DROP TABLE `+ShadowTable); err != nil {
				return fmt.Errorf("drop %s: %w", ShadowTable, err)
			}
		}
		stmts, err := shadowDDL(ctx, tx)
		if err != nil {
			return err
		}
		stmts = append(stmts, `DELETE FROM checkpoints WHERE projection = '`+ShadowName+`'`)
		for _, q := range stmts {
			if _, err := tx.Exec(ctx, q); err != nil {
				return fmt.Errorf("create %s: %w", ShadowTable, err)
			}
		}
		return nil
	})
	if err != nil {
		return false, err
	}
	if resumed {
		r.log.Info("continuing the shadow of an interrupted rebuild", "table", ShadowTable)
	}
	return resumed, nil
}
