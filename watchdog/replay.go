package watchdog

import (
	"context"
	"encoding/json"
	"math"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// replayMargin widens a replay window by time beyond the position's write (replayWindow):
// the write's own way to the server, and the clocks of a cluster's servers.
const replayMargin = 5 * time.Second

// replayWindow is the part of READINGS that a consumer reads again after it resumed from
// somewhere else than its own progress, and that a previous run may have applied already:
// the messages up to the stream's last sequence as the consumer resumed (nothing stored
// later can have been applied), stored before untilNS (unix ns) at the latest. When the
// consumer resumed after a position written at some time, untilNS is PositionEvery after
// it, plus replayMargin: a position is written each PositionEvery while the partition
// moves, so its writer applied nothing stored much later. A reading in the window writes
// its key only when the key does not already stand for it or a newer reading (keyCovers):
// a replayed older reading never shortens a key that a newer one set, and never overwrites
// the declared mark of a sensor that went silent after it.
type replayWindow struct {
	untilSeq uint64
	untilNS  int64
}

// holds says whether the message of md is in the window.
func (r replayWindow) holds(md *jetstream.MsgMetadata) bool {
	return md.Sequence.Stream <= r.untilSeq && md.Timestamp.UnixNano() <= r.untilNS
}

// newReplayWindow is the window of a consumer that resumes at next with READINGS' last
// sequence last. own: it resumes at this process's own progress, which is exact (no
// window). written: when the position it resumes after was written (zero: not at a
// position, e.g. a start over, or the ack floor of a consumer left on the server).
func newReplayWindow(next, last uint64, own bool, written time.Time, every time.Duration) replayWindow {
	if own || next > last {
		return replayWindow{}
	}
	until := int64(math.MaxInt64)
	if !written.IsZero() {
		until = written.Add(every + replayMargin).UnixNano()
	}
	return replayWindow{untilSeq: last, untilNS: until}
}

// keyCovers says whether sensor's key holds a value (not an expiry) that stands for a
// reading received at or after received: writing a reading received then would shorten it,
// or undo its declared mark. Receive times, not sequences, are compared: a key may still
// stand for a reading of a stream that READINGS replaced. Unknown counts as not covered.
func (w *Watchdog) keyCovers(ctx context.Context, sensor string, received time.Time) bool {
	kvs, err := w.bucket(ctx)
	if err != nil {
		return false
	}
	m, err := kvs.GetLastMsgForSubject(ctx, w.kvSubject(sensor))
	if err != nil || len(m.Data) == 0 {
		return false
	}
	var v keyValue
	if json.Unmarshal(m.Data, &v) != nil {
		return false
	}
	return v.ReceivedNS >= received.UnixNano()
}
