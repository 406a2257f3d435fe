// Package rebuild holds what the rebuilds of the projections share with the runner that
// starts them (projector/rebuild) and with those that show them (api, alerter): progress
// and result, the runner's requests and statuses, the Projection interface with its one
// Adapter, and the READINGS look-ups a rebuild starts from. The rebuilds themselves live with
// their projections (projector/state, projector/history).
package rebuild

import (
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"
)

// ErrLogTruncated: a stream no longer holds the start of the log (stream limits).
var ErrLogTruncated = errors.New("READINGS no longer holds the start of the log")

// Progress is a rebuild's progress: Done of Total messages (Total moves with the log), Rate
// in messages/s since the start, ETA at that rate.
type Progress struct {
	Phase string // "catch-up", "swap" or "done"
	Done  uint64
	Total uint64
	Rate  float64
	ETA   time.Duration
}

// Result sums up a finished rebuild.
type Result struct {
	Applied uint64 // messages applied to the shadow by this run
	Resumed bool   // the shadow of an earlier, interrupted run was continued
	// EventsChecked matched EVENTS (or the live outbox); EventsUnverified could not be
	// checked because EVENTS no longer holds its start.
	EventsChecked, EventsUnverified int
	OldTable                        string // the replaced table (history: the suffix of the replaced tables), kept until dropped
	Elapsed                         time.Duration
}

// ReportProgress calls progress (or, when it is nil, logs) every period and once at stop,
// with the counts of messages done and pending that counts sums up.
func ReportProgress(log *slog.Logger, period time.Duration, progress func(Progress), counts func() (done, pending uint64),
	phase *atomic.Value, start time.Time) (stop func()) {
	snapshot := func() Progress {
		var pr Progress
		d, p := counts()
		pr.Done, pr.Total = d, d+p
		pr.Phase = phase.Load().(string)
		if el := time.Since(start).Seconds(); el > 0 {
			pr.Rate = float64(pr.Done) / el
		}
		if pr.Rate > 0 {
			pr.ETA = time.Duration(float64(pr.Total-pr.Done) / pr.Rate * float64(time.Second))
		}
		return pr
	}
	emit := func() {
		pr := snapshot()
		if progress != nil {
			progress(pr)
			return
		}
		log.Info("rebuild progress", "phase", pr.Phase, "done", pr.Done, "total", pr.Total,
			"per_second", int64(pr.Rate), "eta", pr.ETA.Round(time.Second))
	}
	quit, finished := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			select {
			case <-quit:
				emit()
				return
			case <-t.C:
				emit()
			}
		}
	}()
	return func() { close(quit); <-finished }
}

// OldSuffix names the tables a swap replaces by the time, to the millisecond, in an order
// that sorts.
func OldSuffix(t time.Time) string {
	t = t.UTC()
	return t.Format("20060102150405") + fmt.Sprintf("%03d", t.Nanosecond()/1e6)
}
