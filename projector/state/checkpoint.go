package state

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/redact"
)

// A checkpoint is a position in one READINGS stream, not in "the" log: when the NATS store
// is lost or replaced while Postgres is kept, the stream is created again and starts over at
// sequence 1, and a bare sequence would make a projection skip every new reading at or below
// it, silently. So each checkpoint row names the stream it was written on (checkpoints.stream,
// the stream's creation time, which JetStream keeps across restarts and restores from a
// backup), written in the same transaction as the sequence. A checkpoint of another stream,
// or one ahead of the stream's last sequence (a store restored from an older backup, or one
// that lost its last writes), stops its partition loudly until the store is restored or the
// operator rebases the checkpoints (Rebase, `locks replay --rebase`).

// ErrCheckpointMismatch is matched by a CheckpointMismatchError.
var ErrCheckpointMismatch = errors.New("checkpoint does not belong to the READINGS stream")

// RebaseCommand is the way out named by a checkpoint mismatch, besides restoring the store.
const RebaseCommand = "locks replay --projection=state --rebase"

// CheckpointMismatchError says why a partition's checkpoint does not fit READINGS.
type CheckpointMismatchError struct {
	Projection string
	Partition  int
	Seq        uint64 // the checkpoint
	Stream     string // the stream the checkpoint names; empty when written before streams were recorded
	Current    string // the stream READINGS is now
	LastSeq    uint64 // READINGS' last sequence when checked
}

// OtherStream says the checkpoint was written on another stream (rather than only being
// ahead of this one).
func (e *CheckpointMismatchError) OtherStream() bool { return e.Stream != "" && e.Stream != e.Current }

func (e *CheckpointMismatchError) Error() string {
	why := fmt.Sprintf("checkpoint %d is ahead of READINGS (created %s), whose last sequence is %d: the store was restored from an older copy or lost its last writes",
		e.Seq, e.Current, e.LastSeq)
	if e.OtherStream() {
		why = fmt.Sprintf("checkpoint %d was written on READINGS created %s, but READINGS now is the stream created %s: the NATS store was lost or replaced",
			e.Seq, e.Stream, e.Current)
	}
	return fmt.Sprintf("%s projection, partition %d: %s", e.Projection, e.Partition, why)
}

func (e *CheckpointMismatchError) Unwrap() error { return ErrCheckpointMismatch }

// WayOut is what an operator can do about it.
func (e *CheckpointMismatchError) WayOut() string {
	if e.OtherStream() {
		return "restore the NATS store the checkpoint was written on, or run `" + RebaseCommand +
			"` to apply the current stream from its start on top of the state kept in Postgres"
	}
	return "restore the NATS store with its last writes, or run `" + RebaseCommand +
		" --from-time=<when the store came back>` to apply what the stream received since, on top of the state kept in Postgres"
}

// streamPosition is what a checkpoint is checked against: the stream's identity and extent.
type streamPosition struct {
	id                string
	firstSeq, lastSeq uint64
	msgs              uint64
}

func readingsPosition(ctx context.Context, js jetstream.JetStream) (streamPosition, error) {
	st, err := natsx.Stream(ctx, js, natsx.ReadingsStream)
	if err != nil {
		return streamPosition{}, fmt.Errorf("%s info: %w", natsx.ReadingsStream, err)
	}
	info := st.CachedInfo()
	return streamPosition{id: natsx.StreamIdentity(info), firstSeq: info.State.FirstSeq, lastSeq: info.State.LastSeq, msgs: info.State.Msgs}, nil
}

// checkCheckpoint returns a *CheckpointMismatchError when checkpoint seq (written on stream,
// "" when unknown) does not belong to the stream at pos. A checkpoint at 0 has applied
// nothing and fits any stream; one of unknown stream fits if it is not ahead.
func checkCheckpoint(projection string, p int, seq uint64, stream string, pos streamPosition) error {
	if seq == 0 || (seq <= pos.lastSeq && (stream == "" || stream == pos.id)) {
		return nil
	}
	return &CheckpointMismatchError{Projection: projection, Partition: p, Seq: seq, Stream: stream, Current: pos.id, LastSeq: pos.lastSeq}
}

// mismatchedCheckpoints returns the checkpoints of projection that do not belong to the
// stream at pos, in partition order, locking every checkpoint row of the projection when
// lock is set. Checkpoints move on while this runs (the live projector of another process):
// one that looks ahead of pos is judged again against READINGS as read after the
// checkpoints, so that only one really ahead of the stream is returned.
func mismatchedCheckpoints(ctx context.Context, q querier, js jetstream.JetStream, projection string, pos streamPosition, lock bool) ([]*CheckpointMismatchError, error) {
	cps, err := readCheckpoints(ctx, q, projection, lock)
	if err != nil {
		return nil, err
	}
	parts := slices.Sorted(maps.Keys(cps))
	judge := func(pos streamPosition) (out []*CheckpointMismatchError, ahead bool) {
		for _, p := range parts {
			var mm *CheckpointMismatchError
			if errors.As(checkCheckpoint(projection, p, cps[p].seq, cps[p].stream, pos), &mm) {
				out = append(out, mm)
				ahead = ahead || !mm.OtherStream()
			}
		}
		return out, ahead
	}
	out, ahead := judge(pos)
	if !ahead {
		return out, nil
	}
	now, err := readingsPosition(ctx, js)
	if err != nil {
		return nil, err
	}
	if now.id != pos.id {
		return out, nil // replaced meanwhile: the caller's view stands
	}
	out, _ = judge(now)
	return out, nil
}

// refusals are the partitions a part refuses to process because their checkpoints do not
// belong to READINGS: logged once each, shown by /readyz (Ready) and by the gauge
// locks_checkpoint_mismatch{projection,partition}.
type refusals struct {
	projection string
	log        *slog.Logger
	gauge      *prometheus.GaugeVec
	mu         sync.Mutex
	by         map[int]*CheckpointMismatchError
}

func newRefusals(reg prometheus.Registerer, projection string, parts []int, log *slog.Logger) (*refusals, error) {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "locks_checkpoint_mismatch",
		Help: "1 while a projection refuses a partition whose checkpoint does not belong to the READINGS stream (the NATS store was lost, replaced or rolled back)."},
		[]string{"projection", "partition"})
	if err := reg.Register(g); err != nil {
		return nil, fmt.Errorf("%s checkpoint metrics: %w", projection, err)
	}
	for _, p := range parts {
		g.WithLabelValues(projection, strconv.Itoa(p)).Set(0)
	}
	return &refusals{projection: projection, log: log, gauge: g, by: map[int]*CheckpointMismatchError{}}, nil
}

// refuse records that partition e.Partition is refused; the first time (or when the reason
// changes) it says so in one log line with the way out.
func (r *refusals) refuse(e *CheckpointMismatchError) {
	r.mu.Lock()
	prev, was := r.by[e.Partition]
	r.by[e.Partition] = e
	r.mu.Unlock()
	r.gauge.WithLabelValues(r.projection, strconv.Itoa(e.Partition)).Set(1)
	// The stream's last sequence moves while the partition waits: only another checkpoint or
	// another stream is news worth a line.
	if was && prev.Seq == e.Seq && prev.Stream == e.Stream && prev.Current == e.Current {
		return
	}
	r.log.Error("partition stopped: its checkpoint does not belong to the READINGS stream; nothing of it is applied until this is resolved",
		"projection", r.projection, "partition", e.Partition, "reason", e.Error(), "way_out", e.WayOut())
}

// clear records that partition p goes on.
func (r *refusals) clear(p int) {
	r.mu.Lock()
	e, was := r.by[p]
	delete(r.by, p)
	r.mu.Unlock()
	if was {
		r.gauge.WithLabelValues(r.projection, strconv.Itoa(p)).Set(0)
		r.log.Info("partition goes on: its checkpoint belongs to the READINGS stream again",
			"projection", r.projection, "partition", p, "was", e.Error())
	}
}

// Ready is nil unless a partition is refused; its error names them, the first reason and
// the way out.
func (r *refusals) Ready(context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.by) == 0 {
		return nil
	}
	parts := make([]int, 0, len(r.by))
	for p := range r.by {
		parts = append(parts, p)
	}
	slices.Sort(parts)
	names := make([]string, len(parts))
	for i, p := range parts {
		names[i] = strconv.Itoa(p)
	}
	first := r.by[parts[0]]
	// Public: it names a projection, partitions and sequences, no host or credential, and an
	// operator looking at /readyz needs the way out.
	return redact.Public(fmt.Errorf("%s projection refuses partition(s) %s: %v; %s", r.projection, strings.Join(names, ","), first, first.WayOut()))
}
