package projector

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/lock-sensors/lock-sensors/internal/natsx"
)

// The rebuild runner runs rebuilds inside a serving process (the admin API of `locks run`):
// Start begins one in the background, one at a time per projection, and Status and
// Projections say how it goes, beside each projection's checkpoints and lag behind READINGS.

// Projection names a rebuild can be started for.
const (
	HistoryProjection = "history"
)

var (
	// ErrRebuildRunning: a rebuild of the projection is under way already.
	ErrRebuildRunning = errors.New("a rebuild of this projection is running")
	// ErrUnknownProjection: not state or history.
	ErrUnknownProjection = errors.New("unknown projection: want state or history")
	// ErrNoReadingAfter: READINGS holds no message at or after the time asked for.
	ErrNoReadingAfter = errors.New("READINGS holds no message at or after that time")
)

// RebuildRequest asks for a rebuild of Projection (StateProjection or HistoryProjection)
// from FromSeq, or from the first READINGS message at or after FromTime (not both).
type RebuildRequest struct {
	Projection string
	FromSeq    uint64
	FromTime   time.Time
}

// RebuildStatus is a rebuild started by a RebuildRunner: under way or the last one.
type RebuildStatus struct {
	Projection string
	Running    bool
	// Phase is "starting" (before the first progress report), "catch-up", "swap", "done"
	// or "failed".
	Phase       string
	Done, Total uint64  // READINGS (history: all three streams') messages
	Rate        float64 // messages/s since the start
	ETA         time.Duration
	FromSeq     uint64 // the READINGS sequence it starts at (0: the beginning)
	Started     time.Time
	Finished    time.Time // zero while running
	Err         string    // why it failed
	Result      RebuildResult
}

// PartitionInfo is one partition of a projection: the READINGS sequence it has applied up
// to (Checkpoint), the partition's last sequence in READINGS, and Lag, the number of the
// partition's messages after the checkpoint.
type PartitionInfo struct {
	Partition  int
	Checkpoint uint64
	LastSeq    uint64
	Lag        uint64
}

// ProjectionInfo is a projection's checkpoints and lag per partition, and its rebuild
// (running or last) when one was started here.
type ProjectionInfo struct {
	Name       string
	Partitions []PartitionInfo
	Lag        uint64 // the sum of the partitions'
	Rebuild    *RebuildStatus
}

// RebuildRunnerConfig configures a RebuildRunner.
type RebuildRunnerConfig struct {
	// PartitionCount is LOCKS_PARTITIONS.
	PartitionCount int
	// HistoryDurable is the history projector's consumer name prefix (default "history").
	HistoryDurable string
	// State and History are the templates of the rebuilds' configurations (FromSeq and
	// Progress are set by the runner).
	State   RebuildConfig
	History HistoryRebuildConfig
}

// RebuildRunnerDeps are what the runner's rebuilds and listings run on.
type RebuildRunnerDeps struct {
	JS  jetstream.JetStream
	PG  *pgxpool.Pool
	CH  driver.Conn
	Log *slog.Logger
}

// RebuildRunner starts rebuilds in the background; see the comment at the top of this file.
type RebuildRunner struct {
	cfg RebuildRunnerConfig
	d   RebuildRunnerDeps

	mu     sync.Mutex
	runs   map[string]*RebuildStatus // by projection: the running or last one
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// NewRebuildRunner checks the configuration and dependencies.
func NewRebuildRunner(cfg RebuildRunnerConfig, d RebuildRunnerDeps) (*RebuildRunner, error) {
	if cfg.PartitionCount < 1 {
		return nil, fmt.Errorf("rebuild runner: partition count %d < 1", cfg.PartitionCount)
	}
	if d.JS == nil || d.PG == nil || d.CH == nil || d.Log == nil {
		return nil, errors.New("rebuild runner: JS, PG, CH and Log are required")
	}
	if cfg.HistoryDurable == "" {
		cfg.HistoryDurable = DefaultHistoryDurable
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &RebuildRunner{cfg: cfg, d: d, runs: map[string]*RebuildStatus{}, ctx: ctx, cancel: cancel}, nil
}

// Close stops the rebuilds under way (each can be started again and continues or starts
// over, as after a kill) and waits for them.
func (r *RebuildRunner) Close() {
	r.cancel()
	r.wg.Wait()
}

type runFunc func(context.Context) error

func (f runFunc) Run(ctx context.Context) error { return f(ctx) }

// Alongside returns a part that runs inner and, once inner has returned, stops the
// rebuilds under way: the rebuilds live as long as the API that starts them.
func (r *RebuildRunner) Alongside(inner interface{ Run(context.Context) error }) interface {
	Run(context.Context) error
} {
	return runFunc(func(ctx context.Context) error {
		defer r.Close()
		return inner.Run(ctx)
	})
}

// Start begins a rebuild of req.Projection in the background and returns its status; it
// fails with ErrRebuildRunning while one of that projection runs.
func (r *RebuildRunner) Start(ctx context.Context, req RebuildRequest) (RebuildStatus, error) {
	if req.Projection != StateProjection && req.Projection != HistoryProjection {
		return RebuildStatus{}, fmt.Errorf("%w: %q", ErrUnknownProjection, req.Projection)
	}
	if req.FromSeq != 0 && !req.FromTime.IsZero() {
		return RebuildStatus{}, errors.New("from_seq and from_time exclude each other: give one")
	}
	r.mu.Lock()
	if cur := r.runs[req.Projection]; cur != nil && cur.Running {
		st := *cur
		r.mu.Unlock()
		return st, fmt.Errorf("%w: the rebuild of %s started at %s is in phase %s (%d of %d messages); wait for it to finish",
			ErrRebuildRunning, req.Projection, st.Started.UTC().Format(time.RFC3339), st.Phase, st.Done, st.Total)
	}
	if r.ctx.Err() != nil {
		r.mu.Unlock()
		return RebuildStatus{}, errors.New("rebuild runner: shutting down")
	}
	st := &RebuildStatus{Projection: req.Projection, Running: true, Phase: "starting", FromSeq: req.FromSeq, Started: time.Now()}
	r.runs[req.Projection] = st
	r.wg.Add(1)
	r.mu.Unlock()

	fail := func(err error) (RebuildStatus, error) {
		r.mu.Lock()
		st.Running, st.Phase, st.Err, st.Finished = false, "failed", err.Error(), time.Now()
		out := *st
		r.mu.Unlock()
		r.wg.Done()
		return out, err
	}
	if !req.FromTime.IsZero() {
		seq, err := ResolveFromTime(ctx, r.d.JS, req.FromTime)
		if err != nil {
			return fail(err)
		}
		r.mu.Lock()
		st.FromSeq = seq
		r.mu.Unlock()
		req.FromSeq = seq
	}
	progress := func(p RebuildProgress) {
		r.mu.Lock()
		defer r.mu.Unlock()
		if st.Running {
			st.Phase, st.Done, st.Total, st.Rate, st.ETA = p.Phase, p.Done, p.Total, p.Rate, p.ETA
		}
	}
	var run func(context.Context) (RebuildResult, error)
	log := r.d.Log.With("started_by", "api")
	switch req.Projection {
	case StateProjection:
		c := r.cfg.State
		c.PartitionCount, c.FromSeq, c.Progress = r.cfg.PartitionCount, req.FromSeq, progress
		sr, err := NewStateRebuild(c, RebuildDeps{JS: r.d.JS, PG: r.d.PG, Log: log})
		if err != nil {
			return fail(err)
		}
		run = sr.Run
	default:
		c := r.cfg.History
		c.FromSeq, c.Progress = req.FromSeq, progress
		hr, err := NewHistoryRebuild(c, r.d.JS, r.d.CH, log)
		if err != nil {
			return fail(err)
		}
		run = hr.Run
	}
	r.mu.Lock()
	out := *st
	r.mu.Unlock()
	go func() {
		defer r.wg.Done()
		res, err := run(r.ctx)
		r.mu.Lock()
		defer r.mu.Unlock()
		st.Running, st.Finished, st.Result = false, time.Now(), res
		if err != nil {
			st.Phase, st.Err = "failed", err.Error()
			log.Error("rebuild failed", "projection", req.Projection, "err", err)
			return
		}
		st.Phase, st.Done = "done", max(st.Done, res.Applied)
		st.Total = max(st.Total, st.Done)
		st.Rate = float64(res.Applied) / max(res.Elapsed.Seconds(), 1e-9)
		st.ETA = 0
	}()
	return out, nil
}

// Status is the running or last rebuild of projection started here.
func (r *RebuildRunner) Status(projection string) (RebuildStatus, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	st, ok := r.runs[projection]
	if !ok {
		return RebuildStatus{}, false
	}
	return *st, true
}

// Projections lists the state and history projections (and the state rebuild's shadow while
// it has checkpoints) with their checkpoints and lag per partition, and their rebuilds.
//
// The state projection's checkpoints are its Postgres checkpoints; the lag of a partition is
// the num_pending of a short-lived consumer on READINGS filtered to the partition and
// starting right after the checkpoint (the server counts it from its per-subject index,
// exact and without reading the messages). The history projection keeps no checkpoint of
// its own: its READINGS durable consumers' ack floor is its checkpoint, and their
// num_pending plus num_ack_pending its lag.
func (r *RebuildRunner) Projections(ctx context.Context) ([]ProjectionInfo, error) {
	st, err := r.d.JS.Stream(ctx, natsx.ReadingsStream)
	if err != nil {
		return nil, fmt.Errorf("look up %s: %w", natsx.ReadingsStream, err)
	}
	var out []ProjectionInfo
	for _, name := range []string{StateProjection, StateRebuildProjection} {
		cps, err := readCheckpoints(ctx, r.d.PG, name, false)
		if err != nil {
			return nil, err
		}
		if name == StateRebuildProjection && len(cps) == 0 {
			continue
		}
		pi := ProjectionInfo{Name: name}
		for p := range r.cfg.PartitionCount {
			part := PartitionInfo{Partition: p, Checkpoint: cps[p]}
			if part.Lag, part.LastSeq, err = partitionLag(ctx, st, p, cps[p]); err != nil {
				return nil, err
			}
			pi.Partitions = append(pi.Partitions, part)
			pi.Lag += part.Lag
		}
		if name == StateProjection {
			if s, ok := r.Status(StateProjection); ok {
				pi.Rebuild = &s
			}
		}
		out = append(out, pi)
	}
	hi := ProjectionInfo{Name: HistoryProjection}
	for p := range r.cfg.PartitionCount {
		part := PartitionInfo{Partition: p}
		cons, err := st.Consumer(ctx, historyReadingsConsumer(r.cfg.HistoryDurable, p))
		switch {
		case errors.Is(err, jetstream.ErrConsumerNotFound):
			// Never run: nothing applied.
			if part.Lag, part.LastSeq, err = partitionLag(ctx, st, p, 0); err != nil {
				return nil, err
			}
		case err != nil:
			return nil, fmt.Errorf("history consumer of partition %d: %w", p, err)
		default:
			info := cons.CachedInfo()
			part.Checkpoint, part.Lag = info.AckFloor.Stream, info.NumPending+uint64(info.NumAckPending)
			if part.LastSeq, err = partitionLastSeq(ctx, st, p); err != nil {
				return nil, err
			}
		}
		hi.Partitions = append(hi.Partitions, part)
		hi.Lag += part.Lag
	}
	if s, ok := r.Status(HistoryProjection); ok {
		hi.Rebuild = &s
	}
	return append(out, hi), nil
}

// partitionLag counts the messages of partition p after seq cp, with a consumer that lives
// only for the count, and gives the partition's last sequence.
func partitionLag(ctx context.Context, st jetstream.Stream, p int, cp uint64) (lag, last uint64, _ error) {
	cons, err := st.CreateConsumer(ctx, jetstream.ConsumerConfig{
		FilterSubject: natsx.ReadingsPartitionFilter(p), AckPolicy: jetstream.AckNonePolicy,
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: cp + 1,
		InactiveThreshold: 10 * time.Second, MemoryStorage: true, Replicas: 1,
	})
	if err != nil {
		return 0, 0, fmt.Errorf("count READINGS of partition %d after %d: %w", p, cp, err)
	}
	lag = cons.CachedInfo().NumPending
	if err := st.DeleteConsumer(ctx, cons.CachedInfo().Name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return 0, 0, fmt.Errorf("delete the counting consumer: %w", err)
	}
	if last, err = partitionLastSeq(ctx, st, p); err != nil {
		return 0, 0, err
	}
	return lag, last, nil
}

// partitionLastSeq is the sequence of partition p's last message in READINGS (0: none).
func partitionLastSeq(ctx context.Context, st jetstream.Stream, p int) (uint64, error) {
	m, err := st.GetLastMsgForSubject(ctx, natsx.ReadingsPartitionFilter(p))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("last READINGS message of partition %d: %w", p, err)
	}
	return m.Sequence, nil
}

// ResolveFromTime is the sequence of the first READINGS message stored at or after t (by
// the stream's own timestamps), or ErrNoReadingAfter.
func ResolveFromTime(ctx context.Context, js jetstream.JetStream, t time.Time) (uint64, error) {
	st, err := js.Stream(ctx, natsx.ReadingsStream)
	if err != nil {
		return 0, fmt.Errorf("look up %s: %w", natsx.ReadingsStream, err)
	}
	info := st.CachedInfo() // current: js.Stream has just asked for it
	if info.State.Msgs == 0 || t.After(info.State.LastTime) {
		// Also keeps times beyond the year 2262 (no UnixNano) away from the server.
		return 0, fmt.Errorf("%w: %s (the last one is from %s)", ErrNoReadingAfter, t.Format(time.RFC3339Nano), info.State.LastTime.Format(time.RFC3339Nano))
	}
	at := t
	cons, err := st.CreateConsumer(ctx, jetstream.ConsumerConfig{
		AckPolicy: jetstream.AckNonePolicy, DeliverPolicy: jetstream.DeliverByStartTimePolicy, OptStartTime: &at,
		InactiveThreshold: 10 * time.Second, MemoryStorage: true, Replicas: 1,
	})
	if err != nil {
		return 0, fmt.Errorf("READINGS from %s: %w", t.Format(time.RFC3339Nano), err)
	}
	defer func() { _ = st.DeleteConsumer(context.WithoutCancel(ctx), cons.CachedInfo().Name) }()
	if cons.CachedInfo().NumPending == 0 {
		return 0, fmt.Errorf("%w: %s", ErrNoReadingAfter, t.Format(time.RFC3339Nano))
	}
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		return 0, fmt.Errorf("READINGS from %s: %w", t.Format(time.RFC3339Nano), err)
	}
	for m := range batch.Messages() {
		md, err := m.Metadata()
		if err != nil {
			return 0, fmt.Errorf("message metadata: %w", err)
		}
		return md.Sequence.Stream, nil
	}
	if err := batch.Error(); err != nil {
		return 0, fmt.Errorf("READINGS from %s: %w", t.Format(time.RFC3339Nano), err)
	}
	return 0, fmt.Errorf("%w: %s", ErrNoReadingAfter, t.Format(time.RFC3339Nano))
}
