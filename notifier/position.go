package notifier

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/lock-sensors/lock-sensors/internal/lease"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/pgtx"
)

// Where a partition's intake resumes in EVENTS is kept in Postgres (notifier_positions), not
// in its JetStream consumer, which keeps its state in memory only: a file-backed consumer has
// its state file rewritten by the server up to ten times a second while messages flow. The
// position is the last EVENTS sequence of the partition taken in, written in the intake's
// transaction with the delivery rows under the partition's fence, so it is exactly as
// durable as they are. A run of messages that made no transaction (all set aside) moves it
// in memory; the next transaction carries it, or it is written on its own at most every
// positionFlushInterval and at a clean stop. Resuming a little early is harmless (the intake
// skips what it has by (event_id, client_id)); resuming late would lose events, and cannot
// happen: the position never runs ahead of committed rows.

// positionFlushInterval bounds how long a position no transaction carried stays unwritten:
// at most this much of the partition is read again after a crash.
const positionFlushInterval = 5 * time.Second

// consumerName is partition p's EVENTS consumer.
func consumerName(p int) string { return "notifier-" + strconv.Itoa(p) }

// intake is where partition p's intake stands, as the owner of epoch.
type intake struct {
	p     int
	epoch int64
	// stream is the identity (natsx.StreamIdentity) of the EVENTS stream done belongs to;
	// "" until the consumer's first open.
	stream string
	// done is the last EVENTS sequence of p taken in: its rows committed, or nothing to commit.
	done uint64
	// saved is what notifier_positions holds for p as this intake last read or wrote it;
	// savedAt is when, or when a write last failed.
	saved   position
	savedAt time.Time
}

// position is an EVENTS sequence and the stream it belongs to.
type position struct {
	seq    uint64
	stream string
}

// took records that everything of the partition up to seq was taken in.
func (in *intake) took(seq uint64) { in.done = max(in.done, seq) }

// dirty says done is not what Postgres holds.
func (in *intake) dirty() bool {
	return in.stream != "" && in.saved != position{seq: in.done, stream: in.stream}
}

// resumeVerdict says why a partition resumes where it does.
type resumeVerdict int

const (
	// resumeAfter: right after the position.
	resumeAfter resumeVerdict = iota
	// resumeFloor: there is no position yet; after the consumer's ack floor (where a notifier
	// that kept its position in a file-backed consumer left off), or at the stream's start.
	resumeFloor
	// resumeOtherStream: the position belongs to another stream (the NATS store was lost or
	// replaced; the new stream's sequences start again at 1): this one is read from its start.
	resumeOtherStream
	// resumeAhead: the position is past the end of its own stream (the store was restored
	// from an older copy, or lost its last writes): read on after the end, where new events
	// will come; what the stream still holds was taken in.
	resumeAhead
)

// resumeFrom decides the EVENTS sequence a partition reads next: after the position pos
// (found: there is one), or when there is none after floor, the consumer's ack floor; never
// before the stream's first message, which retention may have moved past the position.
//
// A position of another stream is not refused, as a state checkpoint is: the intake is
// idempotent by event id, not by sequence, so reading a new stream from its start skips
// nothing and sends nothing twice, and refusing would hold back the events that the new
// stream does carry. Resuming on a position ahead of its stream would skip the events that
// come next under the sequences it passed, so it reads on from the stream's end instead.
func resumeFrom(pos position, found bool, floor uint64, cur natsx.Extent) (uint64, resumeVerdict) {
	var after uint64
	v := resumeAfter
	switch {
	case !found:
		after, v = min(floor, cur.Last), resumeFloor
	case pos.stream != cur.ID:
		after, v = 0, resumeOtherStream
	case pos.seq > cur.Last:
		after, v = cur.Last, resumeAhead
	default:
		after = pos.seq
	}
	return max(after+1, cur.First), v
}

// resume is the stream sequence in's consumer starts at, asked at every (re)open: after
// what this intake took in when it has read before, else after the position in Postgres.
// A position that had to be decided afresh (none yet, another stream, past the end) is
// written at once, under the fence: the consumer that the floor is read from is deleted
// when the reader recreates it in memory.
func (n *Notifier) resume(ctx context.Context, in *intake) (uint64, error) {
	pos, found := position{seq: in.done, stream: in.stream}, in.stream != ""
	if !found {
		var err error
		if pos, found, err = readPosition(ctx, n.db, in.p); err != nil {
			return 0, err
		}
		if found {
			in.saved, in.savedAt = pos, time.Now()
		}
	}
	// The position first, then the stream: a stream read after it is never behind it.
	st, err := natsx.Stream(ctx, n.js, natsx.EventsStream)
	if err != nil {
		return 0, fmt.Errorf("%s info: %w", natsx.EventsStream, err)
	}
	info := st.CachedInfo()
	cur := natsx.ExtentOf(info)
	var floor uint64
	if !found {
		if floor, err = n.ackFloor(ctx, in.p); err != nil {
			return 0, err
		}
	}
	next, v := resumeFrom(pos, found, floor, cur)
	log := n.log.With("partition", in.p, "position", pos.seq, "next", next)
	switch {
	case v == resumeFloor && floor > 0:
		log.Info("no EVENTS position in Postgres yet: starting after the consumer's ack floor", "ack_floor", floor)
	case v == resumeFloor:
		log.Info("no EVENTS position in Postgres yet, nor a consumer: starting at the stream's first message")
	case v == resumeOtherStream:
		log.Error("the EVENTS position belongs to another stream (the NATS store was lost or replaced): reading this stream from its start; the intake is idempotent by event id, so nothing is sent twice",
			"position_stream", pos.stream, "events_stream", cur.ID)
	case v == resumeAhead:
		log.Error("the EVENTS position is past the end of the stream (the store was restored from an older copy or lost its last writes): reading on after its end, where new events come",
			"events_last_seq", cur.Last)
	}
	// Written before in moves: should the write fail, the next open decides again from
	// Postgres, and the consumer (whose floor may be all there is) is not recreated meanwhile.
	at := position{seq: next - 1, stream: cur.ID}
	if v != resumeAfter {
		if err := n.savePosition(ctx, in, at); err != nil {
			return 0, err
		}
	}
	in.stream, in.done = at.stream, at.seq
	return next, nil
}

// ackFloor is the stream sequence up to which partition p's consumer, if there is one, has
// everything acknowledged; 0 when there is none.
func (n *Notifier) ackFloor(ctx context.Context, p int) (uint64, error) {
	actx, cancel := context.WithTimeout(ctx, natsx.RequestTimeout)
	defer cancel()
	c, err := n.js.Consumer(actx, natsx.EventsStream, consumerName(p))
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("consumer %s: %w", consumerName(p), err)
	}
	return c.CachedInfo().AckFloor.Stream, nil
}

// readPosition returns partition p's position; found is false when it has none.
func readPosition(ctx context.Context, db DB, p int) (pos position, found bool, err error) {
	var seq int64
	err = db.QueryRow(ctx, `SELECT seq, stream FROM notifier_positions WHERE partition = $1`, p).Scan(&seq, &pos.stream)
	if errors.Is(err, pgx.ErrNoRows) {
		return position{}, false, nil
	}
	if err != nil {
		return position{}, false, fmt.Errorf("read the EVENTS position of partition %d: %w", p, err)
	}
	pos.seq = uint64(seq)
	return pos, true, nil
}

// queuePosition queues the write of partition p's position, in a transaction that checked
// the fence.
func queuePosition(b *pgx.Batch, p int, pos position) {
	b.Queue(`INSERT INTO notifier_positions (partition, seq, stream) VALUES ($1, $2, $3)
		ON CONFLICT (partition) DO UPDATE SET seq = excluded.seq, stream = excluded.stream, updated_at = now()`,
		p, int64(pos.seq), pos.stream)
}

// savePosition writes pos as in's partition's position in a transaction of its own: the
// fence in the first round trip (a fence that failed must not reach COMMIT), the write with
// the COMMIT.
func (n *Notifier) savePosition(ctx context.Context, in *intake, pos position) error {
	err := pgtx.Run(ctx, n.db, func(tx *pgtx.Tx) error {
		f := &pgx.Batch{}
		lease.QueueCheck(f, Name, in.p)
		if err := tx.Send(ctx, f, func(br pgx.BatchResults) error { return lease.ReadCheck(br, Name, in.p, in.epoch) }); err != nil {
			return err
		}
		w := &pgx.Batch{}
		queuePosition(w, in.p, pos)
		return tx.Commit(ctx, w, nil)
	})
	if err != nil {
		return fmt.Errorf("write the EVENTS position of partition %d: %w", in.p, err)
	}
	in.saved, in.savedAt = pos, time.Now()
	return nil
}

// flushPosition writes a position that no transaction carried, once it has waited
// positionFlushInterval since the last write (or the last try).
func (n *Notifier) flushPosition(ctx context.Context, in *intake) error {
	if !in.dirty() || time.Since(in.savedAt) < positionFlushInterval {
		return nil
	}
	err := n.savePosition(ctx, in, position{seq: in.done, stream: in.stream})
	if err != nil {
		in.savedAt = time.Now()
	}
	return err
}

// flushPositionAtStop writes the position at a clean stop, so that the next owner reads
// nothing again; after a crash it reads at most positionFlushInterval of messages again.
func (n *Notifier) flushPositionAtStop(ctx context.Context, in *intake) {
	if !in.dirty() {
		return
	}
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := n.savePosition(fctx, in, position{seq: in.done, stream: in.stream}); err != nil {
		n.log.Info("EVENTS position not written at stop; the next owner reads a little again", "partition", in.p, "err", err)
	}
}
