package watchdog

import (
	"context"
	"maps"
	"slices"

	"golang.org/x/sync/errgroup"

	"github.com/lock-sensors/lock-sensors/internal/lease"
	"github.com/lock-sensors/lock-sensors/internal/partition"
)

// own watches partition p until ctx is done (the watchdog stopping, or the partition released
// or lost): its READINGS consumer refreshes the keys, its watch holds their expiries, and the
// declare loop settles them while p is still this process's (see mayAct). The epoch is not
// used: the watchdog writes nothing to Postgres.
func (w *Watchdog) own(ctx context.Context, p int, _ int64) error {
	ps := &partState{lease: ctx}
	w.partsMu.Lock()
	w.parts[p] = ps
	w.partsMu.Unlock()
	defer w.disown(p, ps)
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return w.consume(gctx, p, ps) })
	g.Go(func() error { return w.watch(gctx, p) })
	err := g.Wait()
	// The next owner (or this process after a restart) resumes exactly where this one
	// stopped; a process killed before this resumes from the position written last.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), positionWriteWait)
	defer cancel()
	if serr := w.savePosition(sctx, p, ps); serr != nil {
		w.log.Info("position not written at stop; the next owner resumes from the last one written", "partition", p, "err", serr)
	}
	return err
}

// disown forgets partition p and the expiries held for its sensors: its new owner's watch
// replays the markers that are still unsettled.
func (w *Watchdog) disown(p int, ps *partState) {
	w.partsMu.Lock()
	if w.parts[p] == ps {
		delete(w.parts, p)
	}
	w.partsMu.Unlock()
	w.mu.Lock()
	for s := range w.held {
		if partition.Of(s, w.cfg.PartitionCount) == p {
			delete(w.held, s)
		}
	}
	n := len(w.held)
	w.mu.Unlock()
	w.m.held.Set(float64(n))
}

// part is owned partition p's state, nil when p is not owned.
func (w *Watchdog) part(p int) *partState {
	w.partsMu.RLock()
	defer w.partsMu.RUnlock()
	return w.parts[p]
}

// ownedParts is a copy of the owned partitions' states, by partition.
func (w *Watchdog) ownedParts() map[int]*partState {
	w.partsMu.RLock()
	defer w.partsMu.RUnlock()
	return maps.Clone(w.parts)
}

// owned is the owned partitions, sorted.
func (w *Watchdog) owned() partition.Set {
	return slices.Sorted(maps.Keys(w.ownedParts()))
}

// mayAct says whether this process may still write for partition p: it owns p and its lease
// is younger than the TTL, so no other process can have claimed p yet (lease.Valid). A write
// that passed this check and lands late (a pause between the check and the publish) is
// harmless: a liveness_timeout fact carries the Nats-Msg-Id of the sensor's last READINGS
// message (FactMsgID), so the new owner's fact for the same silence is stored once, and the
// state projector decides lost from the log alone (fact time − last reading ≥ lost_after),
// so a late fact after a newer reading declares nothing; key writes are conditional on the
// key's revision, or a refresh that settle checks against READINGS before any declaration.
func (w *Watchdog) mayAct(p int) bool {
	ps := w.part(p)
	return ps != nil && lease.Valid(ps.lease)
}
