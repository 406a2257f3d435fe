package watchdog

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/lock-sensors/lock-sensors/internal/backoff"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/partition"
)

// candidate is an expiry seen and not yet settled.
type candidate struct {
	rev uint64    // KV revision of the marker (or of what the sweep found; 0: no message)
	at  time.Time // server time of the marker
	// expect: the key must still be at rev when we write it (always, but for a hand-made
	// candidate in tests).
	expect bool
	// heldSince is when this process first held the sensor's expiry (set by addCandidate).
	// It counts from here, not from the marker, so that markers replayed after a restart
	// into a backlog are held for MaxHold like fresh ones.
	heldSince time.Time
	// overdue: settled because it was held for MaxHold, not because the pipeline caught up.
	overdue bool
}

// declareBurstWait lets a burst of markers gather into one declare round.
const declareBurstWait = 20 * time.Millisecond

// addCandidate holds an expiry of sensor and wakes the declare loop.
func (w *Watchdog) addCandidate(sensor string, c candidate) {
	now := w.clock.Now()
	w.mu.Lock()
	// Held since the first expiry of this silence that is still held: a second one (the
	// sweep's, or a marker replayed after a reconnect) does not restart the bound.
	if old, ok := w.held[sensor]; ok && !old.heldSince.IsZero() {
		c.heldSince = old.heldSince
	} else if c.heldSince.IsZero() {
		c.heldSince = now
	}
	w.held[sensor] = c
	n := len(w.held)
	w.heldPeak = max(w.heldPeak, n)
	w.mu.Unlock()
	w.m.held.Set(float64(n))
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// supersede drops the expiry held for sensor when the key has a newer value (revision rev).
func (w *Watchdog) supersede(sensor string, rev uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if c, ok := w.held[sensor]; ok && c.rev != 0 && c.rev < rev {
		delete(w.held, sensor)
	}
}

// declareLoop examines the held expiries whenever one arrives and every HoldCheckEvery.
func (w *Watchdog) declareLoop(ctx context.Context) error {
	t := time.NewTicker(w.cfg.HoldCheckEvery)
	defer t.Stop()
	defer w.workersDone.Wait()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-w.wake:
			backoff.Sleep(ctx, declareBurstWait)
		}
		if err := w.declareRound(ctx); err != nil && ctx.Err() == nil {
			w.log.Warn("examining expiries", "err", err)
		}
	}
}

// caughtUp reports, per partition, the stored time up to which every reading has refreshed
// its key (math.MaxInt64 when the consumer has nothing left undelivered), given in parts the
// newest expiry held for the partition (unix ns). The partitions' consumers are asked at once:
// one round trip per round, not one per partition, and only those whose progress has not
// already passed their newest expiry: while readings flow in (or our own facts, in a burst),
// progress alone answers, and a round asks nothing.
func (w *Watchdog) caughtUp(ctx context.Context, parts map[int]int64) (map[int]int64, error) {
	var mu sync.Mutex
	out := map[int]int64{}
	set := func(p int, upTo int64) {
		mu.Lock()
		out[p] = upTo
		mu.Unlock()
	}
	g, gctx := errgroup.WithContext(ctx)
	for p, newest := range parts {
		ps := w.part(p)
		var cons jetstream.Consumer
		if ps != nil {
			cons = ps.consumer()
		}
		if cons == nil {
			set(p, 0) // not ours (any more), or not consuming yet: settle drops its expiries
			continue
		}
		done := ps.doneTS.Load()
		if newest <= done {
			set(p, done) // the partitions asked meanwhile write out too
			continue
		}
		g.Go(func() error {
			info, err := cons.Info(gctx)
			if err != nil {
				return fmt.Errorf("READINGS consumer of partition %d: %w", p, err)
			}
			// Nothing left undelivered: caught up. Messages delivered and not acked (in our
			// buffer, or held by a crashed predecessor until AckWait) need no waiting for:
			// settle reads each sensor's last message in READINGS itself.
			upTo := done
			if info.NumPending == 0 {
				upTo = int64(^uint64(0) >> 1)
			}
			set(p, upTo)
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	return out, nil
}

// declareRound queues for settling the held expiries whose partition has applied every
// reading stored before them while the upstream is caught up, and, whatever the lag, those
// held for MaxHold: a backlog that does not drain must not hide a sensor that really went
// silent. settle still reads the sensor's last message in READINGS, so one whose reading did
// reach the log is refreshed, not declared; one whose reading is still upstream is declared,
// and restored when that reading comes through.
//
// It does not wait for what it queued (see settleWorker): a burst of expiries arriving while
// an earlier one is being settled is queued at the next round, not after the earlier one
// has been settled to its last expiry.
func (w *Watchdog) declareRound(ctx context.Context) error {
	failErr := w.takeFailures()
	// Asked every round, so that a recovery is seen even while nothing is held.
	behind := w.upstream.behind(ctx)
	now := w.clock.Now()
	w.mu.Lock()
	if len(w.held) == 0 {
		w.held, w.heldPeak = shrunk(w.held, w.heldPeak)
		w.mu.Unlock()
		w.setHeldGauges(0, time.Time{}, now)
		return failErr
	}
	parts := map[int]int64{}
	if !behind {
		for s, c := range w.held {
			p := partition.Of(s, w.cfg.PartitionCount)
			parts[p] = max(parts[p], c.at.UnixNano())
		}
	}
	w.mu.Unlock()
	var upTo map[int]int64
	var lagErr error
	if !behind {
		// Unknown progress counts as behind: only expiries past the bound go.
		upTo, lagErr = w.caughtUp(ctx, parts)
	}
	readings, err := w.readingsStream(ctx)
	if err != nil {
		return errors.Join(failErr, err)
	}
	var due []job
	var oldest time.Time
	w.mu.Lock()
	for s, c := range w.held {
		if _, ok := w.settling[s]; ok {
			continue // its earlier expiry is being settled: this one waits for the outcome
		}
		var ok bool
		ok, c.overdue = heldDue(c, upTo[partition.Of(s, w.cfg.PartitionCount)], upTo != nil, now, w.cfg.MaxHold)
		if ok || c.overdue {
			due = append(due, job{s, c})
			delete(w.held, s)
		} else if oldest.IsZero() || c.heldSince.Before(oldest) {
			oldest = c.heldSince
		}
	}
	n := len(w.held)
	w.held, w.heldPeak = shrunk(w.held, w.heldPeak)
	w.mu.Unlock()
	w.setHeldGauges(n, oldest, now)
	w.enqueue(ctx, readings, due)
	return errors.Join(failErr, lagErr)
}

// heldDue decides whether a held expiry c goes to settle now. caught: its partition has
// applied every reading stored before the expiry (known says whether the partitions'
// progress was asked; upTo is the partition's, unix ns; unknown progress counts as behind,
// and so does the upstream's lag: declareRound then does not ask). overdue: not caught,
// but held for maxHold by now, so a backlog that does not drain hides no silent sensor.
func heldDue(c candidate, upTo int64, known bool, now time.Time, maxHold time.Duration) (caught, overdue bool) {
	caught = known && c.at.UnixNano() <= upTo
	return caught, !caught && now.Sub(c.heldSince) >= maxHold
}

// readingsStream is READINGS, looked up once: a round then costs no stream info request.
func (w *Watchdog) readingsStream(ctx context.Context) (jetstream.Stream, error) {
	if s := w.readings.Load(); s != nil {
		return *s, nil
	}
	s, err := w.js.Stream(ctx, natsx.ReadingsStream)
	if err != nil {
		return nil, fmt.Errorf("READINGS: %w", err)
	}
	w.readings.Store(&s)
	return s, nil
}

// bucket is the liveness bucket's stream, looked up once.
func (w *Watchdog) bucket(ctx context.Context) (jetstream.Stream, error) {
	if s := w.kv.Load(); s != nil {
		return *s, nil
	}
	s, err := w.js.Stream(ctx, kvStream)
	if err != nil {
		return nil, fmt.Errorf("liveness bucket: %w", err)
	}
	w.kv.Store(&s)
	return s, nil
}

// setHeldGauges publishes how many expiries are held and how long the oldest has been.
func (w *Watchdog) setHeldGauges(n int, oldest, now time.Time) {
	w.m.held.Set(float64(n))
	if n == 0 || oldest.IsZero() {
		w.m.oldestHeld.Set(0)
		return
	}
	w.m.oldestHeld.Set(now.Sub(oldest).Seconds())
}
