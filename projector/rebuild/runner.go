package rebuild

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/part"
)

// The runner runs rebuilds inside a serving process (the admin API of `locks run`): Start
// begins one in the background, one at a time per projection, and Status and List say how
// it goes, beside each projection's checkpoints and lag behind READINGS.

var (
	// ErrRunning: a rebuild of the projection is under way already.
	ErrRunning = errors.New("a rebuild of this projection is running")
	// ErrUnknownProjection: no Projection of the runner has the name.
	ErrUnknownProjection = errors.New("unknown projection")
	// ErrNoReadingAfter: READINGS holds no message at or after the time asked for.
	ErrNoReadingAfter = errors.New("READINGS holds no message at or after that time")
)

// Projection is a projection the runner can rebuild and list.
type Projection interface {
	// Name is the projection's name in requests ("state", "history").
	Name() string
	// Rebuild prepares a rebuild starting at READINGS sequence fromSeq (0: the start) that
	// reports to progress; the returned function runs it.
	Rebuild(fromSeq uint64, progress func(Progress), log *slog.Logger) (func(context.Context) (Result, error), error)
	// Infos lists the projection's partitions (and those of what it keeps beside, such as a
	// rebuild's shadow), readings being the READINGS stream.
	Infos(ctx context.Context, readings jetstream.Stream, partitionCount int) ([]Info, error)
}

// Request asks for a rebuild of Projection from FromSeq, or from the first READINGS message
// at or after FromTime (not both).
type Request struct {
	Projection string
	FromSeq    uint64
	FromTime   time.Time
}

// Status is a rebuild started by a Runner: under way or the last one.
type Status struct {
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
	Result      Result
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

// Info is a projection's checkpoints and lag per partition, and its rebuild (running or
// last) when one was started here.
type Info struct {
	Name       string
	Partitions []PartitionInfo
	Lag        uint64 // the sum of the partitions'
	Rebuild    *Status
}

// Config configures a Runner.
type Config struct {
	// PartitionCount is LOCKS_PARTITIONS.
	PartitionCount int
}

// Validate reports the first bad field.
func (c Config) Validate() error {
	if c.PartitionCount < 1 {
		return fmt.Errorf("rebuild runner: partition count %d < 1", c.PartitionCount)
	}
	return nil
}

// Deps are what the runner runs on: the projections it rebuilds and lists, in listing order.
type Deps struct {
	JS          jetstream.JetStream
	Logger      *slog.Logger
	Projections []Projection
}

// Runner starts rebuilds in the background; see the comment at the top of this file.
type Runner struct {
	cfg   Config
	js    jetstream.JetStream
	log   *slog.Logger
	projs []Projection

	mu     sync.Mutex
	runs   map[string]*Status // by projection: the running or last one
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// New checks the configuration and dependencies.
func New(cfg Config, d Deps) (*Runner, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := part.Require("rebuild runner", part.Dep{Name: "JS", Value: d.JS}, part.Dep{Name: "Logger", Value: d.Logger}); err != nil {
		return nil, err
	}
	if len(d.Projections) == 0 {
		return nil, fmt.Errorf("rebuild runner: %w: Projections", part.ErrMissingDep)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Runner{cfg: cfg, js: d.JS, log: d.Logger, projs: d.Projections, runs: map[string]*Status{}, ctx: ctx, cancel: cancel}, nil
}

// Close stops the rebuilds under way (each can be started again and continues or starts
// over, as after a kill) and waits for them.
func (r *Runner) Close() {
	r.cancel()
	r.wg.Wait()
}

type runFunc func(context.Context) error

func (f runFunc) Run(ctx context.Context) error { return f(ctx) }

// Alongside returns a part that runs inner and, once inner has returned, stops the
// rebuilds under way: the rebuilds live as long as the API that starts them.
func (r *Runner) Alongside(inner interface{ Run(context.Context) error }) interface {
	Run(context.Context) error
} {
	return runFunc(func(ctx context.Context) error {
		defer r.Close()
		return inner.Run(ctx)
	})
}

func (r *Runner) projection(name string) (Projection, error) {
	names := make([]string, len(r.projs))
	for i, p := range r.projs {
		if p.Name() == name {
			return p, nil
		}
		names[i] = p.Name()
	}
	return nil, fmt.Errorf("%w %q: want %s", ErrUnknownProjection, name, strings.Join(names, " or "))
}

// Start begins a rebuild of req.Projection in the background and returns its status; it
// fails with ErrRunning while one of that projection runs.
func (r *Runner) Start(ctx context.Context, req Request) (Status, error) {
	proj, err := r.projection(req.Projection)
	if err != nil {
		return Status{}, err
	}
	if req.FromSeq != 0 && !req.FromTime.IsZero() {
		return Status{}, errors.New("from_seq and from_time exclude each other: give one")
	}
	r.mu.Lock()
	if cur := r.runs[req.Projection]; cur != nil && cur.Running {
		st := *cur
		r.mu.Unlock()
		return st, fmt.Errorf("%w: the rebuild of %s started at %s is in phase %s (%d of %d messages); wait for it to finish",
			ErrRunning, req.Projection, st.Started.UTC().Format(time.RFC3339), st.Phase, st.Done, st.Total)
	}
	if r.ctx.Err() != nil {
		r.mu.Unlock()
		return Status{}, errors.New("rebuild runner: shutting down")
	}
	st := &Status{Projection: req.Projection, Running: true, Phase: "starting", FromSeq: req.FromSeq, Started: time.Now()}
	r.runs[req.Projection] = st
	r.wg.Add(1)
	r.mu.Unlock()

	fail := func(err error) (Status, error) {
		r.mu.Lock()
		st.Running, st.Phase, st.Err, st.Finished = false, "failed", err.Error(), time.Now()
		out := *st
		r.mu.Unlock()
		r.wg.Done()
		return out, err
	}
	if !req.FromTime.IsZero() {
		seq, err := ResolveFromTime(ctx, r.js, req.FromTime)
		if err != nil {
			return fail(err)
		}
		r.mu.Lock()
		st.FromSeq = seq
		r.mu.Unlock()
		req.FromSeq = seq
	}
	progress := func(p Progress) {
		r.mu.Lock()
		defer r.mu.Unlock()
		if st.Running {
			st.Phase, st.Done, st.Total, st.Rate, st.ETA = p.Phase, p.Done, p.Total, p.Rate, p.ETA
		}
	}
	log := r.log.With("started_by", "api")
	run, err := proj.Rebuild(req.FromSeq, progress, log)
	if err != nil {
		return fail(err)
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
func (r *Runner) Status(projection string) (Status, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	st, ok := r.runs[projection]
	if !ok {
		return Status{}, false
	}
	return *st, true
}

// List lists the projections with their checkpoints and lag per partition (see each
// Projection's Infos), and their rebuilds.
func (r *Runner) List(ctx context.Context) ([]Info, error) {
	st, err := r.js.Stream(ctx, natsx.ReadingsStream)
	if err != nil {
		return nil, fmt.Errorf("look up %s: %w", natsx.ReadingsStream, err)
	}
	var out []Info
	for _, p := range r.projs {
		infos, err := p.Infos(ctx, st, r.cfg.PartitionCount)
		if err != nil {
			return nil, err
		}
		for i := range infos {
			if infos[i].Name != p.Name() {
				continue
			}
			if s, ok := r.Status(p.Name()); ok {
				infos[i].Rebuild = &s
			}
		}
		out = append(out, infos...)
	}
	return out, nil
}
