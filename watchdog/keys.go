package watchdog

import (
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/partition"
)

// kvStream is the stream behind the liveness bucket, read directly for markers and values.
const kvStream = "KV_" + natsx.LivenessBucket

// keyOf is a sensor's key: "<partition>.<sensor_id>", so that a process owning some
// partitions watches only their keys.
func keyOf(sensor string, partitions int) string {
	return strconv.Itoa(partition.Of(sensor, partitions)) + "." + sensor
}

// kvSubject is the bucket subject of a sensor's key.
func (w *Watchdog) kvSubject(sensor string) string {
	return natsx.LivenessKeySubject(keyOf(sensor, w.cfg.PartitionCount))
}

// kvFilters are the bucket subjects of the partitions owned, of count.
func kvFilters(owned partition.Set, count int) []string {
	if len(owned) == count {
		return []string{natsx.LivenessKeySubject(">")}
	}
	f := make([]string, 0, len(owned))
	for _, p := range owned {
		f = append(f, natsx.LivenessKeySubject(strconv.Itoa(p)+".*"))
	}
	return f
}

// sensorOfSubject is the sensor of a bucket subject, if it is one of an owned partition.
func (w *Watchdog) sensorOfSubject(subj string) (string, bool) {
	key, ok := strings.CutPrefix(subj, natsx.LivenessKeySubject(""))
	if !ok {
		return "", false
	}
	p, sensor, ok := strings.Cut(key, ".")
	if !ok {
		return "", false
	}
	n, err := strconv.Atoi(p)
	if err != nil || n < 0 || n >= w.cfg.PartitionCount || w.part(n) == nil {
		return "", false
	}
	return sensor, true
}

// encodeValue is a key's value. A refresh carries the reading's receive time and READINGS
// sequence; a declared sensor's value (no TTL) carries "lost" and the same two, so a restart
// does not declare it again and the sweep can compare.
func encodeValue(received time.Time, seq uint64, lost bool) []byte {
	b := make([]byte, 0, 64)
	b = append(b, `{"received_ns":`...)
	b = strconv.AppendInt(b, received.UnixNano(), 10)
	b = append(b, `,"seq":`...)
	b = strconv.AppendUint(b, seq, 10)
	if lost {
		b = append(b, `,"lost":true`...)
	}
	return append(b, '}')
}

// keyValue is encodeValue's JSON, decoded.
type keyValue struct {
	ReceivedNS int64  `json:"received_ns"`
	Seq        uint64 `json:"seq"`
	Lost       bool   `json:"lost"`
}

// sensorKey is a sensor id (1 to 16 ASCII letters and digits, docs/contract.md) packed six bits
// a character (62 symbols and padding): a map key of 12 bytes instead of a string, that
// holds no pointer, smaller than a [16]byte and nothing for the GC to scan
// (BenchmarkWrittenMap; its figures are in BENCHMARKS.md).
type sensorKey [12]byte

// keyOfSensor is the key of id, if id is a contract id: two ids never share a key, since the
// packing keeps every character and code 0 only pads. Other ids get none (and are always
// written; the envelope checks refuse them anyway).
func keyOfSensor(id string) (sensorKey, bool) {
	var k sensorKey
	if len(id) == 0 || len(id) > 16 {
		return k, false
	}
	// Characters 0-7 into the first six bytes, 8-15 into the last six.
	var half [2]uint64
	for i := 0; i < len(id); i++ {
		code, ok := sensorCharCode(id[i])
		if !ok {
			return k, false
		}
		half[i/8] |= uint64(code) << (6 * (i % 8))
	}
	for h := range half {
		for b := range 6 {
			k[6*h+b] = byte(half[h] >> (8 * b))
		}
	}
	return k, true
}

// sensorCharCode is c's code in a sensorKey: 1-62 for letters and digits, none for others.
func sensorCharCode(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0' + 1, true
	case c >= 'A' && c <= 'Z':
		return c - 'A' + 11, true
	case c >= 'a' && c <= 'z':
		return c - 'a' + 37, true
	}
	return 0, false
}

// ceilSeconds is unix nanoseconds as unix seconds rounded up, in the uint32 a deadline is
// kept in (good until 2106; anything outside is clamped, which only costs a key write).
func ceilSeconds(ns int64) uint32 {
	s := (ns + int64(time.Second) - 1) / int64(time.Second)
	return uint32(min(max(s, 0), math.MaxUint32))
}
