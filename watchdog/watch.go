package watchdog

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/lock-sensors/lock-sensors/internal/backoff"
	"github.com/lock-sensors/lock-sensors/internal/partition"
)

const (
	watchPullBatch = 4000
	// watchDrainWait bounds how long a stopping watch waits for its consumer to drain.
	watchDrainWait = 5 * time.Second
)

// watch follows partition p's keys in the bucket (headers only) for limit markers.
func (w *Watchdog) watch(ctx context.Context, p int) error {
	for ctx.Err() == nil {
		oc, err := w.js.OrderedConsumer(ctx, kvStream, jetstream.OrderedConsumerConfig{
			FilterSubjects: kvFilters(partition.Set{p}, w.cfg.PartitionCount),
			DeliverPolicy:  jetstream.DeliverLastPerSubjectPolicy,
			HeadersOnly:    true,
		})
		if err != nil {
			w.log.Warn("watch liveness bucket; retrying", "err", err)
			backoff.Sleep(ctx, restartDelay)
			continue
		}
		cc, err := oc.Consume(w.onKVMsg, jetstream.PullMaxMessages(watchPullBatch))
		if err != nil {
			w.log.Warn("watch liveness bucket; retrying", "err", err)
			backoff.Sleep(ctx, restartDelay)
			continue
		}
		<-ctx.Done()
		cc.Drain()
		select {
		case <-cc.Closed():
		case <-time.After(watchDrainWait):
		}
	}
	return nil
}

// onKVMsg holds the expiry a limit marker announces, or drops a held one a newer value
// supersedes.
func (w *Watchdog) onKVMsg(m jetstream.Msg) {
	sensor, ok := w.sensorOfSubject(m.Subject())
	if !ok {
		return
	}
	md, err := m.Metadata()
	if err != nil {
		return
	}
	if m.Headers().Get(jetstream.MarkerReasonHeader) == "" {
		w.supersede(sensor, md.Sequence.Stream)
		return
	}
	w.m.expiries.Inc()
	w.addCandidate(sensor, candidate{rev: md.Sequence.Stream, expect: true, at: md.Timestamp})
}
