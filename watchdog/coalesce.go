package watchdog

import (
	"time"

	"github.com/nats-io/nats.go"
)

// ttlFor is the TTL that makes the key expire lost_after after the reading was received:
// what is left, rounded up to whole seconds (the server's unit) so it never expires early,
// and at least 1 s so an already-overdue sensor expires at once and goes through the check.
func ttlFor(left time.Duration) time.Duration {
	s := (left + time.Second - 1) / time.Second
	if s < 1 {
		s = 1
	}
	return s * time.Second
}

// refreshMsg is the key write for a reading received at received, and its TTL.
func (w *Watchdog) refreshMsg(sensor string, received time.Time, seq uint64, now time.Time) (*nats.Msg, time.Duration) {
	ttl := ttlFor(w.lostAfter(sensor) - now.Sub(received))
	return &nats.Msg{Subject: w.kvSubject(sensor), Data: encodeValue(received, seq, false), Header: nats.Header{}}, ttl
}

// coalesceSlack is how far a sensor's deadline may move before its key is written again.
// A reporting sensor then costs a KV write per lost_after/4 instead of one per reading (the
// refresh is most of the watchdog's load on NATS). Skipping is safe because an expiry is
// always settled against the sensor's last message in READINGS: a key that expires up to
// the slack early finds a reading younger than lost_after and is refreshed with the time
// left, so the fact still comes on time. Short timeouts (tests, demos) write every reading,
// since the refresh-on-check rounds its TTL up to a whole second.
func coalesceSlack(lostAfter time.Duration) time.Duration {
	if lostAfter < time.Minute {
		return 0
	}
	return lostAfter / 4
}

// refreshDue is the coalescing decision for a reading whose deadline is deadline (unix ns),
// given the deadline last written for the sensor (whole seconds rounded up; known false
// when none is remembered). The true written deadline lies in (stored-1s, stored]: skip
// only when this one is within the slack after its lower end (the sweep relies on a key
// standing for a reading at most the slack older than the last), and not before it (a key
// may then stand for a reading under a second newer than this one: harmless).
func refreshDue(stored uint32, known bool, deadline int64, slack time.Duration) bool {
	if slack == 0 || !known {
		return true
	}
	lo := int64(stored)*int64(time.Second) - int64(time.Second)
	return deadline < lo || deadline-lo >= int64(slack)
}

// needsRefresh says whether a reading received at received must write the sensor's key,
// and records the deadline it writes.
func (w *Watchdog) needsRefresh(ps *partState, sensor string, received time.Time) bool {
	lostAfter := w.lostAfter(sensor)
	slack := coalesceSlack(lostAfter)
	if slack == 0 {
		return true // every reading writes: nothing to remember
	}
	k, ok := keyOfSensor(sensor)
	if !ok {
		return true // not a contract id: not worth remembering, always written
	}
	deadline := received.Add(lostAfter).UnixNano()
	ps.mu.Lock()
	defer ps.mu.Unlock()
	stored, known := ps.written[k]
	if !refreshDue(stored, known, deadline, slack) {
		return false
	}
	if ps.written == nil {
		ps.written = map[sensorKey]uint32{}
	}
	ps.written[k] = ceilSeconds(deadline)
	ps.writtenPeak = max(ps.writtenPeak, len(ps.written))
	return true
}
