// Package lease shares a part's partitions between its processes and fences what a process
// writes for a partition it no longer owns.
//
// Leases live in the NATS KV bucket leases_<part>: key p.<n> holds the owner of partition n,
// written with Create (free) and renewed with a revision-checked Update every TTL/3; the
// bucket's TTL (the server's clock) removes a lease nobody renews, so a dead process's
// partitions are free after TTL. Processes announce themselves in members.<owner>, renewed
// with the leases, and each aims at ceil(partitions / members): a process holding more
// releases the extra ones, so the load spreads again when one joins. A lease is only a
// hint: every claim also bumps the partition's epoch in Postgres (partition_owners), and
// the parts check that epoch in the transaction of each commit (QueueCheck, Check), so a
// process paused past its lease rolls back instead of writing. That fence also lets a worker
// go on while its lease cannot be renewed (the bucket electing a leader): it stops only once
// a renewal finds the lease taken, or a commit finds the epoch moved (docs/operations.md).
package lease

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/lock-sensors/lock-sensors/internal/backoff"
	"github.com/lock-sensors/lock-sensors/internal/clock"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/part"
)

// Work processes partition p as owner of epoch until ctx is done (then it returns nil), or
// until a fenced transaction tells it the partition has another owner (an error wrapping
// ErrFenced). Any other error stops the part.
type Work func(ctx context.Context, p int, epoch int64) error

// Bucket is the KV bucket of the leases of part name.
func Bucket(name string) string { return natsx.LeasesBucket(name) }

const memberPrefix = "members."

func partitionKey(p int) string { return "p." + strconv.Itoa(p) }

// Assigner runs a Work on each partition this process owns: the fixed Config.Partitions, or
// those its leases give it.
type Assigner struct {
	cfg Config
	js  jetstream.JetStream
	pg  *pgxpool.Pool
	log *slog.Logger
	// clock times the renewals and the lapses (its Now goes to lapsed and to Valid).
	clock clock.Clock

	owned  prometheus.Gauge
	lost   prometheus.Counter
	claims prometheus.Counter

	kv      jetstream.KeyValue
	held    map[int]*hold
	running map[int]chan struct{} // the last worker started per partition, until it ends
	wake    chan struct{}
	mu      sync.Mutex // running
}

// hold is a lease this process holds and the worker running on it.
type hold struct {
	rev     uint64
	renewed time.Time // sent time of the last successful write of the lease
	lapsed  bool      // not renewed within the TTL since renewed (said once in the log)
	// until is renewed+TTL (monotonic), for Valid: the server drops the lease no sooner.
	until  atomic.Pointer[time.Time]
	cancel context.CancelFunc
	done   chan struct{}
	err    error // the worker's, once done is closed
}

// New checks the configuration and registers the metrics (labelled with the part).
func New(cfg Config, d Deps) (*Assigner, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := part.Require("lease "+cfg.Name, part.Dep{Name: "JS", Value: d.JS}, part.Dep{Name: "PG", Value: d.PG},
		part.Dep{Name: "Logger", Value: d.Logger}, part.Dep{Name: "Registerer", Value: d.Registerer}); err != nil {
		return nil, err
	}
	labels := prometheus.Labels{"part": cfg.Name}
	a := &Assigner{cfg: cfg, js: d.JS, pg: d.PG, log: d.Logger.With("lease", cfg.Name, "owner", cfg.Owner), clock: clock.Or(d.Clock),
		owned: prometheus.NewGauge(prometheus.GaugeOpts{Name: "locks_lease_partitions", ConstLabels: labels,
			Help: "Partitions this process owns."}),
		lost: prometheus.NewCounter(prometheus.CounterOpts{Name: "locks_lease_lost_total", ConstLabels: labels,
			Help: "Partitions this process lost without releasing them (lease taken, or fenced)."}),
		claims: prometheus.NewCounter(prometheus.CounterOpts{Name: "locks_lease_claims_total", ConstLabels: labels,
			Help: "Partitions this process claimed."}),
		held: map[int]*hold{}, running: map[int]chan struct{}{}, wake: make(chan struct{}, 1),
	}
	if err := part.Register(d.Registerer, "lease "+cfg.Name, a.owned, a.lost, a.claims); err != nil {
		return nil, err
	}
	return a, nil
}

// Owner is this process's owner id.
func (a *Assigner) Owner() string { return a.cfg.Owner }

// Run runs work on the owned partitions until ctx is done; then it stops the workers, waits
// for them and releases its leases so that the others take them at once.
func (a *Assigner) Run(ctx context.Context, work Work) error {
	if len(a.cfg.Partitions) > 0 {
		return a.runFixed(ctx, work)
	}
	retry := backoff.New(100*time.Millisecond, a.cfg.Renew)
	for a.kv == nil {
		kv, err := a.bucket(ctx)
		if err == nil {
			a.kv = kv
			break
		}
		if ctx.Err() != nil {
			return nil
		}
		a.log.Warn("lease bucket", "err", err)
		retry.Wait(ctx)
	}
	defer a.releaseAll()
	tick := time.NewTicker(a.cfg.Renew)
	defer tick.Stop()
	for {
		if err := a.round(ctx, work); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		case <-a.wake:
		}
	}
}

// round is one renewal: reap ended workers, note lapsed leases, announce this process, renew
// the leases and drop those another process holds now, then release extra partitions or
// claim free ones to reach the fair share.
func (a *Assigner) round(ctx context.Context, work Work) error {
	start := a.clock.Now()
	if err := a.reap(); err != nil {
		return err
	}
	for p, h := range a.held {
		if lapsed(h.renewed, start, a.cfg.TTL) && !h.lapsed {
			// Paused, cut off, or the bucket electing a leader: the worker goes on, since
			// every commit it makes is fenced in Postgres, but Valid says no until the lease
			// is renewed, and a renewal that finds it taken stops the worker.
			h.lapsed = true
			a.log.Warn("lease not renewed within its TTL; the partition's writes stay fenced until it is renewed or found taken",
				"partition", p, "since_renewal", start.Sub(h.renewed))
		}
	}
	rctx, cancel := context.WithTimeout(ctx, a.cfg.Renew)
	defer cancel()
	if _, err := a.kv.Put(rctx, memberPrefix+a.cfg.Owner, []byte(a.cfg.Owner)); err != nil {
		if ctx.Err() == nil {
			a.log.Warn("announce member", "err", err)
		}
		return nil
	}
	for p, h := range a.held {
		rev, err := a.renewKey(rctx, p, h.rev)
		switch {
		case errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyNotFound):
			a.log.Warn("lease taken by another process; partition stopped", "partition", p, "err", err)
			a.lost.Inc() // counted before the worker sees its stop
			a.drop(p, false)
		case err != nil:
			if ctx.Err() == nil {
				a.log.Warn("renew lease", "partition", p, "err", err)
			}
		default:
			h.rev = rev
			h.renew(start, a.cfg.TTL)
		}
	}
	members, taken, err := a.snapshot(rctx)
	if err != nil {
		if ctx.Err() == nil {
			a.log.Warn("list leases", "err", err)
		}
		return nil
	}
	pl := planRound(a.cfg.Owner, a.cfg.PartitionCount, members, slices.Collect(maps.Keys(a.held)), taken)
	for _, p := range pl.release {
		a.log.Info("partition released to balance the load", "partition", p, "members", members, "share", pl.share)
		a.drop(p, true)
	}
	for _, p := range pl.claim {
		if len(a.held) >= pl.share {
			break
		}
		rev, err := a.kv.Create(rctx, partitionKey(p), []byte(a.cfg.Owner))
		if errors.Is(err, jetstream.ErrKeyExists) {
			continue
		}
		if err != nil {
			if ctx.Err() == nil {
				a.log.Warn("claim lease", "partition", p, "err", err)
			}
			break
		}
		a.start(ctx, p, rev, start, work)
	}
	a.owned.Set(float64(len(a.held)))
	return nil
}

// reap drops the partitions whose worker was fenced, and fails on a worker that ended
// with any other error.
func (a *Assigner) reap() error {
	for p, h := range a.held {
		select {
		case <-h.done:
			if h.err == nil {
				// It ended with its context (this process stopping, or the lease dropped)
				// before this round saw that: nothing to report.
				continue
			}
			if !errors.Is(h.err, ErrFenced) {
				return fmt.Errorf("partition %d: %w", p, h.err)
			}
			a.log.Warn("partition fenced: another process owns it now", "partition", p, "err", h.err)
			a.drop(p, true)
			a.lost.Inc()
		default:
		}
	}
	return nil
}

// start runs work on p once the previous worker of p (if stopping) has ended and the fence
// is claimed.
func (a *Assigner) start(ctx context.Context, p int, rev uint64, renewed time.Time, work Work) {
	a.claims.Inc()
	wctx, cancel := context.WithCancel(ctx)
	h := &hold{rev: rev, cancel: cancel, done: make(chan struct{})}
	h.renew(renewed, a.cfg.TTL)
	wctx = context.WithValue(wctx, untilKey{}, validity{until: &h.until, clock: a.clock})
	a.held[p] = h
	a.mu.Lock()
	prev := a.running[p]
	a.running[p] = h.done
	a.mu.Unlock()
	a.log.Info("partition claimed", "partition", p)
	go func() {
		defer close(h.done)
		defer a.nudge()
		if prev != nil {
			<-prev
		}
		epoch, ok := a.claim(wctx, p)
		if !ok {
			return
		}
		err := work(wctx, p, epoch)
		if wctx.Err() == nil || errors.Is(err, ErrFenced) {
			h.err = err
			if err == nil {
				h.err = fmt.Errorf("worker of partition %d returned before its stop", p)
			}
		}
	}()
}

// claim bumps p's epoch in the fence, retrying while Postgres is away; false when ctx ended.
func (a *Assigner) claim(ctx context.Context, p int) (int64, bool) {
	retry := backoff.New(100*time.Millisecond, a.cfg.Renew)
	for {
		epoch, err := Claim(ctx, a.pg, a.cfg.Name, p, a.cfg.Owner)
		if err == nil {
			return epoch, true
		}
		if ctx.Err() != nil {
			return 0, false
		}
		a.log.Warn("claim partition in Postgres", "partition", p, "err", err)
		retry.Wait(ctx)
	}
}

// drop stops p's worker without waiting for it (a successor's claim waits for its last
// transaction in Postgres) and forgets the lease, deleting it first when release is set.
func (a *Assigner) drop(p int, release bool) {
	h := a.held[p]
	h.cancel()
	delete(a.held, p)
	if release && a.kv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), a.cfg.Renew)
		defer cancel()
		if err := a.kv.Delete(ctx, partitionKey(p), jetstream.LastRevision(h.rev)); err != nil {
			a.log.Debug("release lease; it lapses by itself", "partition", p, "err", err)
		}
	}
}

// releaseAll stops every worker, waits for them, and releases the leases and the membership.
func (a *Assigner) releaseAll() {
	for p, h := range a.held {
		h.cancel()
		<-h.done
		a.drop(p, true)
	}
	a.mu.Lock()
	left := slices.Collect(maps.Values(a.running))
	a.mu.Unlock()
	for _, done := range left {
		<-done
	}
	ctx, cancel := context.WithTimeout(context.Background(), a.cfg.Renew)
	defer cancel()
	_ = a.kv.Delete(ctx, memberPrefix+a.cfg.Owner)
	a.owned.Set(0)
}

func (a *Assigner) nudge() {
	select {
	case a.wake <- struct{}{}:
	default:
	}
}

// runFixed runs work on the given partitions, each claimed in the fence; a fenced one (another
// process was given it too) is claimed again after a pause, as a fixed owner insists.
func (a *Assigner) runFixed(ctx context.Context, work Work) error {
	g, gctx := errgroup.WithContext(ctx)
	for _, p := range a.cfg.Partitions {
		g.Go(func() error {
			for {
				epoch, ok := a.claim(gctx, p)
				if !ok {
					return nil
				}
				err := work(gctx, p, epoch)
				if gctx.Err() != nil {
					return nil
				}
				if !errors.Is(err, ErrFenced) {
					return fmt.Errorf("partition %d: %w", p, err)
				}
				a.lost.Inc()
				a.log.Error("partition fenced by another process given it too; claiming it again", "partition", p, "err", err)
				backoff.Sleep(gctx, a.cfg.TTL)
			}
		})
	}
	a.owned.Set(float64(len(a.cfg.Partitions)))
	return g.Wait()
}

func hash(s string) uint32 {
	h := fnv.New32a()
	_, _ = h.Write([]byte(s))
	return h.Sum32()
}
