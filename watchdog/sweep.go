package watchdog

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/lock-sensors/lock-sensors/internal/partition"
)

// keyState is what a sweep reads of one key.
type keyState struct {
	seenUS int64  // receive time (unix µs, Postgres' precision) of the reading the value stands for
	rev    uint64 // KV revision
	marker bool   // an expiry not settled yet
}

// appliedUpTo is, per owned partition, the READINGS sequence up to which this process has
// refreshed the keys (every sequence when its consumer has nothing pending or unacked).
func (w *Watchdog) appliedUpTo(ctx context.Context) (map[int]uint64, error) {
	out := map[int]uint64{}
	for p, ps := range w.ownedParts() {
		out[p] = ps.doneSeq.Load()
		cons := ps.consumer()
		if cons == nil {
			continue
		}
		info, err := cons.Info(ctx)
		if err != nil {
			return nil, fmt.Errorf("READINGS consumer of partition %d: %w", p, err)
		}
		if info.NumPending == 0 && info.NumAckPending == 0 {
			out[p] = ^uint64(0)
		}
	}
	return out, nil
}

// Sweep compares sensor_state (the state projection) with the liveness keys of the owned
// partitions and repairs what differs: an online sensor whose key is missing, or stands for
// an older reading (by receive time) than the projection has applied, gets its key
// recreated with the TTL left from last_seen (or, when none is left, goes through the expiry
// check). It returns the number of repairs, also added to
// locks_watchdog_reconcile_repairs_total.
//
// Only sensors whose last applied READINGS sequence this process has itself applied are
// compared, so that the watchdog lagging behind the projector (or the other way round) is
// not taken for a difference, and the sweep needs no quiet moment to run.
func (w *Watchdog) Sweep(ctx context.Context) (repairs int, err error) {
	owned := w.owned()
	if len(owned) == 0 {
		return 0, nil
	}
	applied, err := w.appliedUpTo(ctx)
	if err != nil {
		return 0, err
	}
	// Each partition's result is recorded even when nothing differed, so that a clean sweep
	// resolves the alerter's reconciliation_drift (see recordSweep).
	perPart := make(map[int]int, len(owned))
	for _, p := range owned {
		perPart[p] = 0
	}
	defer func() {
		if err == nil {
			err = w.recordSweep(ctx, perPart)
		}
	}()
	keys, err := w.snapshotKeys(ctx, owned)
	if err != nil {
		return 0, err
	}
	suspects, err := w.suspects(ctx, owned, applied, keys)
	if err != nil {
		return 0, err
	}
	if len(suspects) == 0 {
		return 0, nil
	}
	kvs, err := w.js.Stream(ctx, kvStream)
	if err != nil {
		return 0, fmt.Errorf("liveness bucket: %w", err)
	}
	for _, s := range suspects {
		repaired, err := w.repair(ctx, kvs, s)
		if repaired {
			repairs++
			perPart[s.part]++
		}
		if err != nil {
			return repairs, err
		}
	}
	return repairs, nil
}

// suspect is an online sensor of sensor_state whose liveness key the snapshot found
// missing or older than its last reading.
type suspect struct {
	part     int
	sensor   string
	lastSeen time.Time
	lastSeq  uint64
}

// suspects lists the online sensors of the owned partitions whose key in the snapshot keys
// differs from sensor_state, among those whose last sequence is within applied.
func (w *Watchdog) suspects(ctx context.Context, owned partition.Set, applied map[int]uint64, keys map[string]keyState) ([]suspect, error) {
	rows, err := w.pg.Query(ctx, `SELECT sensor_id, partition, last_seen, last_seq FROM sensor_state
		WHERE connection = 'online' AND partition = ANY($1)`, []int(owned))
	if err != nil {
		return nil, fmt.Errorf("read sensor_state: %w", err)
	}
	var suspects []suspect
	for rows.Next() {
		var s suspect
		var seq int64
		var p int
		if err := rows.Scan(&s.sensor, &p, &s.lastSeen, &seq); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read sensor_state: %w", err)
		}
		s.lastSeq = uint64(seq)
		s.part = p
		if a, ok := applied[p]; !ok || s.lastSeq > a {
			continue // we have not got that far in this partition yet
		}
		k, ok := keys[s.sensor]
		// A key may stand for a reading up to the coalescing slack older than the last one.
		slack := coalesceSlack(w.lostAfter(s.sensor)).Microseconds()
		if ok && (k.marker || k.seenUS >= s.lastSeen.UnixMicro()-slack) {
			continue
		}
		suspects = append(suspects, s)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read sensor_state: %w", err)
	}
	return suspects, nil
}

// repair looks at the suspect's key again (a reading may have refreshed it since the
// snapshot) and, when it still differs, recreates it with the TTL left from last_seen, or
// makes it an expiry candidate when none is left. It says whether it counts as a repair
// (also when the recreation then failed).
func (w *Watchdog) repair(ctx context.Context, kvs jetstream.Stream, s suspect) (bool, error) {
	var rev uint64
	m, err := kvs.GetLastMsgForSubject(ctx, w.kvSubject(s.sensor))
	switch {
	case err == nil:
		if m.Header.Get(jetstream.MarkerReasonHeader) != "" {
			return false, nil // an expiry: the expiry path settles it
		}
		var v keyValue
		if json.Unmarshal(m.Data, &v) == nil && v.ReceivedNS/1000 >= s.lastSeen.UnixMicro()-coalesceSlack(w.lostAfter(s.sensor)).Microseconds() {
			return false, nil
		}
		rev = m.Sequence
	case errors.Is(err, jetstream.ErrMsgNotFound):
	default:
		return false, fmt.Errorf("liveness key %s: %w", s.sensor, err)
	}
	w.m.repairs.Inc()
	left := w.lostAfter(s.sensor) - time.Since(s.lastSeen)
	w.log.Warn("reconciliation: liveness key differed from sensor_state; repaired",
		"sensor", s.sensor, "last_seen", s.lastSeen, "last_seq", s.lastSeq, "key_revision", rev, "left", left)
	if left <= 0 {
		w.addCandidate(s.sensor, candidate{rev: rev, expect: true, at: w.clock.Now()})
		return true, nil
	}
	_, err = w.js.PublishMsg(ctx, &nats.Msg{Subject: w.kvSubject(s.sensor), Data: encodeValue(s.lastSeen, s.lastSeq, false), Header: nats.Header{}},
		jetstream.WithMsgTTL(ttlFor(left)), jetstream.WithExpectLastSequencePerSubject(rev))
	if err != nil && !isWrongLastSeq(err) {
		return true, fmt.Errorf("repair liveness key %s: %w", s.sensor, err)
	}
	return true, nil
}

// snapshotKeys reads the newest message of every key of the owned partitions.
func (w *Watchdog) snapshotKeys(ctx context.Context, owned partition.Set) (map[string]keyState, error) {
	out := map[string]keyState{}
	s, err := w.js.Stream(ctx, kvStream)
	if err != nil {
		return nil, fmt.Errorf("liveness bucket: %w", err)
	}
	if s.CachedInfo().State.Msgs == 0 {
		return out, nil
	}
	oc, err := w.js.OrderedConsumer(ctx, kvStream, jetstream.OrderedConsumerConfig{
		FilterSubjects: kvFilters(owned, w.cfg.PartitionCount),
		DeliverPolicy:  jetstream.DeliverLastPerSubjectPolicy,
	})
	if err != nil {
		return nil, fmt.Errorf("read liveness bucket: %w", err)
	}
	it, err := oc.Messages(jetstream.PullMaxMessages(2000))
	if err != nil {
		return nil, fmt.Errorf("read liveness bucket: %w", err)
	}
	defer it.Stop()
	for {
		m, err := it.Next(jetstream.NextMaxWait(10 * time.Second))
		if err != nil {
			return nil, fmt.Errorf("read liveness bucket: %w", err)
		}
		md, err := m.Metadata()
		if err != nil {
			continue
		}
		if sensor, ok := w.sensorOfSubject(m.Subject()); ok {
			k := keyState{rev: md.Sequence.Stream}
			if m.Headers().Get(jetstream.MarkerReasonHeader) != "" || m.Headers().Get("KV-Operation") != "" {
				k.marker = true
			} else {
				var v keyValue
				if json.Unmarshal(m.Data(), &v) == nil {
					k.seenUS = v.ReceivedNS / 1000
				}
			}
			out[sensor] = k
		}
		if md.NumPending == 0 {
			return out, nil
		}
	}
}
