package watchdog

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/lock-sensors/lock-sensors/internal/natsx"
)

// A partition's READINGS consumer is kept in the server's memory, so that the server does
// not rewrite a consumer state file for it many times a second under load. Where it resumes
// is the partition's position instead: the last READINGS sequence of the partition whose
// refresh (and every earlier one's) is stored, with the stream it belongs to. The position
// lives in the liveness bucket itself, under the key "position.<partition>" (never a sensor's
// key: those start with the partition number; written without a TTL, so the bucket's TTLs
// and limit markers never touch it), and is written at most every PositionEvery per
// partition, and once more when the partition stops. So a restart resumes at most about
// PositionEvery behind, and re-applies the refreshes after the position (see docs/watchdog.md,
// "Where the consumer resumes", for why that is harmless).

// PositionEveryDefault is Config.PositionEvery's default.
const PositionEveryDefault = time.Second

// positionWriteWait bounds the wait for the acknowledgement of the position writes.
const positionWriteWait = 5 * time.Second

// positionKeyPrefix is the key family of the positions in the liveness bucket.
const positionKeyPrefix = "position."

// positionSubject is the bucket subject of partition p's position.
func positionSubject(p int) string {
	return natsx.LivenessKeySubject(positionKeyPrefix + strconv.Itoa(p))
}

// position is what a partition's position key holds: READINGS' sequence, and the stream
// (streamIdentity) it is a sequence of.
type position struct {
	Seq    uint64 `json:"seq"`
	Stream string `json:"stream"`
}

// resumePoint is where a partition's consumer starts, from what is known to be refreshed:
// stored, the position key; done, this process's own progress on stream doneStream (0 when
// it has none); acked, the ack floor of a consumer of the partition still on the server (0:
// none). Each is a sequence of the stream it names (a consumer's, of the stream as it is
// now), every message up to which has its refresh stored, so the newest of those that
// belong to the stream now wins.
//
// The keys are derived from the log, and every expiry is settled against READINGS, so
// reading a message again only rewrites a key (docs/watchdog.md), while skipping one loses
// a refresh. So a position that does not fit the stream makes the partition start over at
// the stream's first message: one of another stream (the stream was replaced while the
// bucket was kept), and one ahead of the stream's last message (a store that lost its last
// writes, whose sequences are then taken again by new readings, which are not told apart
// from those the position covered). A position older than the stream's first message
// (gone with its retention) starts at the first. note says which of these happened, ""
// when none.
func resumePoint(stored position, done uint64, doneStream string, acked uint64, now natsx.Extent) (next uint64, note string) {
	first := max(now.First, 1)
	if doneStream != now.ID {
		done = 0
	}
	switch {
	case stored.Seq > 0 && stored.Stream != now.ID:
		note = fmt.Sprintf("the position %d belongs to another READINGS stream (created %s; READINGS now is the stream created %s: the NATS store was lost or replaced): starting over at the stream's first message",
			stored.Seq, stored.Stream, now.ID)
		stored = position{}
	case stored.Seq > now.Last || done > now.Last:
		return first, fmt.Sprintf("the position %d is ahead of READINGS, whose last sequence is %d (the store lost its last writes): starting over at the stream's first message",
			max(stored.Seq, done), now.Last)
	}
	last := max(stored.Seq, done, min(acked, now.Last))
	if last > 0 && last+1 < first && note == "" {
		note = fmt.Sprintf("the position %d is older than READINGS' first message %d (retention): resuming at the first", last, first)
	}
	return max(last+1, first), note
}

// readPosition reads partition p's position and when it was written (server time); none
// (or one that cannot be read) is the zero position.
func (w *Watchdog) readPosition(ctx context.Context, p int) (position, time.Time, error) {
	kvs, err := w.bucket(ctx)
	if err != nil {
		return position{}, time.Time{}, err
	}
	m, err := kvs.GetLastMsgForSubject(ctx, positionSubject(p))
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return position{}, time.Time{}, nil
	case err != nil:
		return position{}, time.Time{}, fmt.Errorf("position of partition %d: %w", p, err)
	}
	var pos position
	if len(m.Data) == 0 || json.Unmarshal(m.Data, &pos) != nil {
		w.log.Warn("the partition's position in the liveness bucket is unreadable; resuming as without one",
			"partition", p, "value", string(m.Data))
		return position{}, time.Time{}, nil
	}
	return pos, m.Time, nil
}

// resumeFunc is the Spec.Resume of partition p's consumer named name: once drained has
// waited for the acker, the consumer starts after the partition's position (resumePoint).
func (w *Watchdog) resumeFunc(p int, ps *partState, name string, drained func(context.Context) (uint64, error)) func(context.Context) (uint64, error) {
	return func(ctx context.Context) (uint64, error) {
		if _, err := drained(ctx); err != nil {
			return 0, err
		}
		st, err := natsx.Stream(ctx, w.js, natsx.ReadingsStream)
		if err != nil {
			return 0, fmt.Errorf("READINGS: %w", err)
		}
		info := st.CachedInfo()
		now := natsx.ExtentOf(info)
		stored, written, err := w.readPosition(ctx, p)
		if err != nil {
			return 0, err
		}
		var acked uint64
		cons, err := w.js.Consumer(ctx, natsx.ReadingsStream, name)
		switch {
		case err == nil:
			acked = cons.CachedInfo().AckFloor.Stream
		case !errors.Is(err, jetstream.ErrConsumerNotFound):
			return 0, fmt.Errorf("consumer %s: %w", name, err)
		}
		ps.mu.Lock()
		done := ps.doneSeq.Load()
		next, note := resumePoint(stored, done, ps.stream, acked, now)
		own := ps.stream == now.ID && done > 0 && next == done+1
		if note != "" || stored.Stream != now.ID || next != stored.Seq+1 {
			written = time.Time{} // not resumed right after the position
		}
		ps.replay = newReplayWindow(next, now.Last, own, written, w.cfg.PositionEvery)
		// The partition's progress is where it resumes: every message before next is
		// refreshed (or was never in this stream), whatever the progress said before (on
		// another stream, or ahead of this one). Nothing is in flight (drained), so the
		// acker cannot store an older sequence after this.
		ps.stream = now.ID
		ps.doneSeq.Store(next - 1)
		if stored.Stream == now.ID && ps.savedPos.Stream != now.ID {
			ps.savedPos = stored // not written again until it moves
		}
		ps.mu.Unlock()
		if note != "" {
			w.log.Warn("READINGS consumer: "+note, "partition", p, "from", next)
		}
		w.log.Debug("READINGS consumer resumes", "partition", p, "from", next, "position", stored.Seq, "acked", acked)
		return next, nil
	}
}

// savePositions writes the position of every owned partition that moved since it was last
// written, all at once, and waits for them.
func (w *Watchdog) savePositions(ctx context.Context) error {
	type write struct {
		ps  *partState
		pos position
		fut jetstream.PubAckFuture
	}
	var writes []write
	var errs []error
	for p, ps := range w.ownedParts() {
		pos, ok := ps.unsaved()
		if !ok {
			continue
		}
		fut, err := w.js.PublishMsgAsync(positionMsg(p, pos))
		if err != nil {
			errs = append(errs, w.savePosition(ctx, p, ps))
			continue
		}
		writes = append(writes, write{ps, pos, fut})
	}
	t := time.NewTimer(positionWriteWait)
	defer t.Stop()
	for _, wr := range writes {
		select {
		case <-wr.fut.Ok():
			wr.ps.saved(wr.pos)
		case err := <-wr.fut.Err():
			errs = append(errs, err)
		case <-t.C:
			return errors.Join(append(errs, errors.New("position writes not acknowledged within "+positionWriteWait.String()))...)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return errors.Join(errs...)
}

// savePosition writes partition p's position if it moved since it was last written.
func (w *Watchdog) savePosition(ctx context.Context, p int, ps *partState) error {
	pos, ok := ps.unsaved()
	if !ok {
		return nil
	}
	if _, err := w.js.PublishMsg(ctx, positionMsg(p, pos)); err != nil {
		return fmt.Errorf("write the position of partition %d: %w", p, err)
	}
	ps.saved(pos)
	return nil
}

func positionMsg(p int, pos position) *nats.Msg {
	b, _ := json.Marshal(pos) // two plain fields: cannot fail
	return &nats.Msg{Subject: positionSubject(p), Data: b, Header: nats.Header{}}
}

// unsaved is the partition's position when it moved since it was last written.
func (ps *partState) unsaved() (position, bool) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	pos := position{Seq: ps.doneSeq.Load(), Stream: ps.stream}
	if pos.Seq == 0 || pos.Stream == "" || pos == ps.savedPos {
		return position{}, false
	}
	return pos, true
}

// saved records that pos is the partition's position as written.
func (ps *partState) saved(pos position) {
	ps.mu.Lock()
	ps.savedPos = pos
	ps.mu.Unlock()
}
