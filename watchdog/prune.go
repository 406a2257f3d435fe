package watchdog

import (
	"math"
	"strings"
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
	for _, ps := range w.parts {
		ps.writtenMu.Lock()
		for s, d := range ps.written {
			if int64(d) < cut {
				delete(ps.written, s)
			}
		}
		ps.written, ps.writtenPeak = shrunk(ps.written, ps.writtenPeak)
		ps.writtenMu.Unlock()
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
	ps, ok := w.parts[partition.Of(sensor, w.cfg.Partitions)]
	k, valid := keyOfSensor(sensor)
	if !ok || !valid {
		return
	}
	ps.writtenMu.Lock()
	delete(ps.written, k)
	ps.written, ps.writtenPeak = shrunk(ps.written, ps.writtenPeak)
	ps.writtenMu.Unlock()
}

// writtenLen is the number of refresh deadlines remembered, over the owned partitions.
func (w *Watchdog) writtenLen() int {
	n := 0
	for _, ps := range w.parts {
		ps.writtenMu.Lock()
		n += len(ps.written)
		ps.writtenMu.Unlock()
	}
	return n
}

// sensorKey is a sensor id (1 to 16 ASCII letters and digits, CONTRACT.md) padded with
// zeros: a map key that needs no string of its own and holds no pointer.
type sensorKey [16]byte

// keyOfSensor is the key of id, if id fits one: at most 16 bytes and no zero byte, so two
// ids never share a key (the envelope checks refuse other ids anyway).
func keyOfSensor(id string) (sensorKey, bool) {
	var k sensorKey
	if len(id) == 0 || len(id) > len(k) || strings.IndexByte(id, 0) >= 0 {
		return k, false
	}
	copy(k[:], id)
	return k, true
}

// ceilSeconds is unix nanoseconds as unix seconds rounded up, in the uint32 a deadline is
// kept in (good until 2106; anything outside is clamped, which only costs a key write).
func ceilSeconds(ns int64) uint32 {
	s := (ns + int64(time.Second) - 1) / int64(time.Second)
	return uint32(min(max(s, 0), math.MaxUint32))
}
