package watchdog

import (
	"time"

	"github.com/lock-sensors/lock-sensors/internal/partition"
)

// shrinkMin is the size below which a per-sensor map is not remade after deletions: the
// copy would cost more than the memory it gives back.
const shrinkMin = 1024

// pruneWritten forgets the refresh deadlines that have passed: the key they stand for has
// expired (or was refreshed on check, which this map does not see), so the next reading of
// the sensor must write its key anyway, with or without the entry. Without this, a fleet
// whose sensors come and go grows the map by every sensor it has ever seen.
func (w *Watchdog) pruneWritten(now time.Time) {
	cut := now.Unix()
	for _, ps := range w.ownedParts() {
		ps.mu.Lock()
		for s, d := range ps.written {
			if int64(d) < cut {
				delete(ps.written, s)
			}
		}
		ps.written, ps.writtenPeak = shrunk(ps.written, ps.writtenPeak)
		ps.mu.Unlock()
	}
}

// shrunk is m remade once it holds a quarter of peak (the most entries it has held) or
// less, with its new peak: Go maps keep their size when entries are deleted, so a map that
// once held a whole fleet would hold on to that memory.
func shrunk[K comparable, V any](m map[K]V, peak int) (map[K]V, int) {
	n := len(m)
	if peak < shrinkMin || n > peak/4 {
		return m, peak
	}
	c := make(map[K]V, n)
	for k, v := range m {
		c[k] = v
	}
	return c, n
}

// forget drops a declared sensor's refresh deadline: its next reading restores it and
// must write its key.
func (w *Watchdog) forget(sensor string) {
	ps := w.part(partition.Of(sensor, w.cfg.PartitionCount))
	k, valid := keyOfSensor(sensor)
	if ps == nil || !valid {
		return
	}
	ps.mu.Lock()
	delete(ps.written, k)
	ps.written, ps.writtenPeak = shrunk(ps.written, ps.writtenPeak)
	ps.mu.Unlock()
}

// writtenLen is the number of refresh deadlines remembered, over the owned partitions.
func (w *Watchdog) writtenLen() int {
	n := 0
	for _, ps := range w.ownedParts() {
		ps.mu.Lock()
		n += len(ps.written)
		ps.mu.Unlock()
	}
	return n
}
