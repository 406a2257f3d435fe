package state

import (
	"time"

	"github.com/lock-sensors/lock-sensors/internal/event"
)

// row is a sensor_state row.
type row struct {
	data            uint8
	lastSeen        time.Time
	lastReadingTime time.Time
	changedAt       time.Time
	revision        int64
	lost            bool
	lastSeq         uint64
}

// step applies one READINGS message to a sensor's row (ok false: no row yet) and appends
// the events it causes; touched says the row was written. It is the whole of the state projector's logic, a pure function of
// the row and the message, so that every replay decides the same.
func step(cur row, ok bool, l event.Log, p int, seq uint64, evs []event.Event) (_ row, touched bool, _ []event.Event) {
	emit := func(typ string, at time.Time, data uint8, prev *uint8) {
		cur.revision++
		evs = append(evs, event.Event{V: event.Version, ID: event.ID(l.SensorID, cur.revision), Type: typ,
			OccurredAt: at, SensorID: l.SensorID, Data: data, PreviousData: prev, Revision: cur.revision,
			Partition: p, Seq: seq})
	}
	switch l.Kind {
	case event.KindReading:
		if l.Untracked {
			// Recorded beyond LOCKS_UNREGISTERED_MAX: the bridge decided that nothing is kept
			// for this sensor, and every replay follows the same mark.
			return cur, false, evs
		}
		if !ok {
			cur = row{data: l.Data, changedAt: l.Time}
			emit(event.TypeStateChanged, l.Time, l.Data, nil)
		} else {
			prev := cur.data
			if cur.lost {
				cur.lost = false
				emit(event.TypeConnectionRestored, l.ReceivedTime, l.Data, &prev)
			}
			if l.Data != prev {
				cur.data, cur.changedAt = l.Data, l.Time
				emit(event.TypeStateChanged, l.Time, l.Data, &prev)
			}
		}
		cur.lastSeen, cur.lastReadingTime, cur.lastSeq = l.ReceivedTime, l.Time, seq
		return cur, true, evs
	case event.KindLivenessTimeout:
		// Lost only if the sensor was still silent for its whole timeout when the key
		// expired; a fact overtaken by a reading is stale.
		if !ok || cur.lost || l.LostAfter <= 0 || l.ReceivedTime.Sub(cur.lastSeen) < l.LostAfter {
			return cur, false, evs
		}
		prev := cur.data
		cur.lost, cur.lastSeq = true, seq
		emit(event.TypeConnectionLost, l.ReceivedTime, cur.data, &prev)
		return cur, true, evs
	}
	return cur, false, evs
}

// item is one READINGS message ready to apply.
type item struct {
	seq uint64
	log event.Log
	// tp is the READINGS message's traceparent, carried to the events the reading derives;
	// read only while tracing.
	tp string
}

// prepareLog checks a READINGS message stored under subject and decodes it as step
// expects it (shared with the rebuild, so that both decide on the very same input): an
// error (wrapping event.ErrInvalid) means the message is set aside, never applied.
func prepareLog(subject string, b []byte, partitions int) (event.Log, error) {
	l, err := event.CheckLog(subject, b, partitions)
	if err != nil {
		return l, err
	}
	// Postgres keeps microseconds: deciding on the same precision in memory makes the
	// outcome independent of where batches happen to be cut.
	l.ReceivedTime = l.ReceivedTime.UTC().Truncate(time.Microsecond)
	if l.Time.IsZero() {
		l.Time = l.ReceivedTime
	}
	l.Time = l.Time.UTC().Truncate(time.Microsecond)
	return l, nil
}
