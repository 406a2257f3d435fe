// Package rebuild is the part that runs rebuilds inside a serving process (the admin API of
// `locks run`): Start begins one in the background, one at a time per projection, and
// Status and List say how it goes, beside each projection's checkpoints and lag behind
// READINGS. What it shares with the projections and the API is internal/rebuild.
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
	rb "github.com/lock-sensors/lock-sensors/internal/rebuild"
)

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
	Projections []rb.Projection
}

// Runner starts rebuilds in the background; see the package comment.
type Runner struct {
	cfg   Config
	js    jetstream.JetStream
	log   *slog.Logger
	projs []rb.Projection

	mu     sync.Mutex
	runs   map[string]*rb.Status // by projection: the running or last one
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
	return &Runner{cfg: cfg, js: d.JS, log: d.Logger, projs: d.Projections, runs: map[string]*rb.Status{}, ctx: ctx, cancel: cancel}, nil
}

// Run serves until ctx ends, then stops the rebuilds under way (each can be started again
// and continues or starts over, as after a kill) and waits for them: the rebuilds live as
// long as the process part that starts them.
func (r *Runner) Run(ctx context.Context) error {
	<-ctx.Done()
	r.Close()
	return nil
}

// Close stops the rebuilds under way and waits for them, as Run does when its ctx ends.
func (r *Runner) Close() {
	r.cancel()
	r.wg.Wait()
}

func (r *Runner) projection(name string) (rb.Projection, error) {
	names := make([]string, len(r.projs))
	for i, p := range r.projs {
		if p.Name() == name {
			return p, nil
		}
		names[i] = p.Name()
	}
	return nil, fmt.Errorf("%w %q: want %s", rb.ErrUnknownProjection, name, strings.Join(names, " or "))
}

// Start begins a rebuild of req.Projection in the background and returns its status; it
// fails with rb.ErrRunning while one of that projection runs.
func (r *Runner) Start(ctx context.Context, req rb.Request) (rb.Status, error) {
	proj, err := r.projection(req.Projection)
	if err != nil {
		return rb.Status{}, err
	}
	if req.FromSeq != 0 && !req.FromTime.IsZero() {
		return rb.Status{}, errors.New("from_seq and from_time exclude each other: give one")
	}
	r.mu.Lock()
	if cur := r.runs[req.Projection]; cur != nil && cur.Running {
		st := *cur
		r.mu.Unlock()
		return st, fmt.Errorf("%w: the rebuild of %s started at %s is in phase %s (%d of %d messages); wait for it to finish",
			rb.ErrRunning, req.Projection, st.Started.UTC().Format(time.RFC3339), st.Phase, st.Done, st.Total)
	}
	if r.ctx.Err() != nil {
		r.mu.Unlock()
		return rb.Status{}, errors.New("rebuild runner: shutting down")
	}
	st := &rb.Status{Projection: req.Projection, Running: true, Phase: "starting", FromSeq: req.FromSeq, Started: time.Now()}
	r.runs[req.Projection] = st
	r.wg.Add(1)
	r.mu.Unlock()

	fail := func(err error) (rb.Status, error) {
		r.mu.Lock()
		st.Running, st.Phase, st.Err, st.Finished = false, "failed", err.Error(), time.Now()
		out := *st
		r.mu.Unlock()
		r.wg.Done()
		return out, err
	}
	if !req.FromTime.IsZero() {
		seq, err := rb.ResolveFromTime(ctx, r.js, req.FromTime)
		if err != nil {
			return fail(err)
		}
		r.mu.Lock()
		st.FromSeq = seq
		r.mu.Unlock()
		req.FromSeq = seq
	}
	progress := func(p rb.Progress) {
		r.mu.Lock()
		defer r.mu.Unlock()
		if st.Running {
			st.Phase, st.Done, st.Total, st.Rate, st.ETA = p.Phase, p.Done, p.Total, p.Rate, p.ETA
		}
	}
	log := r.log.With("started_by", "api")
	run, err := proj.Rebuild(rb.Start{FromSeq: req.FromSeq, Progress: progress, Logger: log})
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
func (r *Runner) Status(projection string) (rb.Status, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	st, ok := r.runs[projection]
	if !ok {
		return rb.Status{}, false
	}
	return *st, true
}

// List lists the projections with their checkpoints and lag per partition (see each
// Projection's Infos), and their rebuilds.
func (r *Runner) List(ctx context.Context) ([]rb.Info, error) {
	st, err := r.js.Stream(ctx, natsx.ReadingsStream)
	if err != nil {
		return nil, fmt.Errorf("look up %s: %w", natsx.ReadingsStream, err)
	}
	var out []rb.Info
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
