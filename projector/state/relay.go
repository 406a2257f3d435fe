package state

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/lock-sensors/lock-sensors/internal/backoff"
	"github.com/lock-sensors/lock-sensors/internal/crashpoint"
	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/staterev"
)

// Relay publishes the outbox rows of its partitions to EVENTS, in id order, with the event
// id as Nats-Msg-Id, and deletes each row only after JetStream has acknowledged it. Rows a
// crash left behind are published again, and neither lost nor doubled (see once).
//
// Publishing is asynchronous for throughput, but a sensor never has two events in flight:
// a round's rows are sent in waves holding at most one row per sensor, and the next wave
// goes only when the previous one is acknowledged in full. A failed publish therefore
// never lets a later event of the same sensor overtake it in EVENTS.
type Relay struct {
	cfg  Config
	js   jetstream.JetStream
	pg   *pgxpool.Pool
	log  *slog.Logger
	wake map[int]chan struct{}

	published prometheus.Counter
	failed    prometheus.Counter
	latency   prometheus.Histogram
}

func newRelay(cfg Config, d Deps, wake map[int]chan struct{}) (*Relay, error) {
	// A context of its own: an ack that never comes must fail the publish (and not hang
	// the relay), which only a context-wide timeout does.
	js, err := jetstream.New(d.JS.Conn(), jetstream.WithPublishAsyncTimeout(cfg.PublishTimeout),
		jetstream.WithPublishAsyncMaxPending(max(cfg.RelayBatch, 256)))
	if err != nil {
		return nil, fmt.Errorf("relay JetStream context: %w", err)
	}
	r := &Relay{cfg: cfg, js: js, pg: d.PG, log: d.Logger.With("part", "relay"), wake: wake,
		published: prometheus.NewCounter(prometheus.CounterOpts{Name: "locks_relay_published_total",
			Help: "Outbox rows published to EVENTS and deleted."}),
		failed: prometheus.NewCounter(prometheus.CounterOpts{Name: "locks_relay_publish_errors_total",
			Help: "Publishes to EVENTS that failed and will be retried."}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "locks_relay_event_age_seconds",
			Help: "Time from an event's commit to the outbox until JetStream acknowledged it.", Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 12)}),
	}
	for _, c := range []prometheus.Collector{r.published, r.failed, r.latency} {
		if err := d.Registerer.Register(c); err != nil {
			return nil, fmt.Errorf("relay metrics: %w", err)
		}
	}
	return r, nil
}

// Run relays every partition of the configuration until ctx is done.
func (r *Relay) Run(ctx context.Context) error {
	g, gctx := errgroup.WithContext(ctx)
	for _, p := range r.cfg.Partitions {
		g.Go(func() error { r.runPartition(gctx, p); return nil })
	}
	return g.Wait()
}

func (r *Relay) runPartition(ctx context.Context, p int) {
	log := r.log.With("partition", p)
	retry := backoff.New(retryMin, retryMax)
	// Until a round has gone through cleanly, rows may be left over from a crash or a
	// failed publish: they are checked against EVENTS first (see once).
	suspect := true
	for ctx.Err() == nil {
		n, err := r.once(ctx, p, suspect)
		suspect = err != nil
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			log.Warn("relay outbox to EVENTS", "err", err)
			retry.Wait(ctx)
			continue
		}
		retry.Reset()
		if n == r.cfg.RelayBatch {
			continue // more is waiting
		}
		select {
		case <-ctx.Done():
		case <-r.wake[p]:
		case <-time.After(r.cfg.RelayPoll):
		}
	}
}

type relayRow struct {
	id       int64
	revision int64
	eventID  string
	sensorID string
	payload  []byte
	created  time.Time
}

// once relays one round of partition p's outbox and returns how many rows it read.
//
// When suspect, rows may already be in EVENTS (published, but the ack or the delete was
// lost): JetStream's de-duplication window catches a quick republish, but not one after a
// long outage, so each sensor's last event in EVENTS is looked up and rows at or below
// its revision are deleted without publishing.
func (r *Relay) once(ctx context.Context, p int, suspect bool) (int, error) {
	rows, err := r.pg.Query(ctx, `SELECT id, revision, event_id, sensor_id, payload, created_at FROM outbox
		WHERE partition = $1 ORDER BY id LIMIT $2`, p, r.cfg.RelayBatch)
	if err != nil {
		return 0, fmt.Errorf("read outbox: %w", err)
	}
	var all []relayRow
	for rows.Next() {
		var o relayRow
		if err := rows.Scan(&o.id, &o.revision, &o.eventID, &o.sensorID, &o.payload, &o.created); err != nil {
			rows.Close()
			return 0, fmt.Errorf("scan outbox: %w", err)
		}
		all = append(all, o)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("read outbox: %w", err)
	}
	if len(all) == 0 {
		return 0, nil
	}
	read := len(all)
	done := make([]int64, 0, len(all))
	if suspect {
		var err error
		if all, done, err = r.dropPublished(ctx, p, all, done); err != nil {
			return 0, err
		}
	}

	// Wave k holds each sensor's k-th row of this round.
	var waves [][]relayRow
	nth := make(map[string]int, len(all))
	for _, o := range all {
		k := nth[o.sensorID]
		nth[o.sensorID] = k + 1
		if k == len(waves) {
			waves = append(waves, nil)
		}
		waves[k] = append(waves[k], o)
	}
	var pubErr error
	for _, wave := range waves {
		futs := make([]jetstream.PubAckFuture, 0, len(wave))
		for _, o := range wave {
			f, err := r.js.PublishMsgAsync(&nats.Msg{Subject: natsx.EventsSubject(p, o.sensorID), Data: o.payload},
				jetstream.WithMsgID(o.eventID))
			if err != nil {
				pubErr = fmt.Errorf("publish %s: %w", o.eventID, err)
				break
			}
			futs = append(futs, f)
		}
		for i, f := range futs {
			select {
			case <-f.Ok():
				done = append(done, wave[i].id)
				r.latency.Observe(time.Since(wave[i].created).Seconds())
			case err := <-f.Err():
				r.failed.Inc()
				if pubErr == nil {
					pubErr = fmt.Errorf("publish %s: %w", wave[i].eventID, err)
				}
			case <-ctx.Done():
				return 0, ctx.Err()
			}
		}
		if pubErr != nil {
			break
		}
	}
	if len(done) > 0 {
		crashpoint.Hit(CrashRelayAfterPublish)
		// Deleting is the relay's own bookkeeping; finish it even when asked to stop, or the
		// rows are only published again (and de-duplicated) by the next run.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		_, err := r.pg.Exec(dctx, `DELETE FROM outbox WHERE id = ANY($1)`, done)
		cancel()
		if err != nil {
			return 0, fmt.Errorf("delete relayed outbox rows: %w", err)
		}
		r.published.Add(float64(len(done)))
	}
	if pubErr != nil {
		return 0, errors.Join(pubErr, fmt.Errorf("%d of %d rows relayed", len(done), read))
	}
	return read, nil
}

// dropPublished moves the rows whose event EVENTS already holds from all to done.
func (r *Relay) dropPublished(ctx context.Context, p int, all []relayRow, done []int64) ([]relayRow, []int64, error) {
	st, err := r.js.Stream(ctx, natsx.EventsStream)
	if err != nil {
		return nil, nil, fmt.Errorf("look up %s: %w", natsx.EventsStream, err)
	}
	last := make(map[string]int64)
	for _, o := range all {
		if _, ok := last[o.sensorID]; ok {
			continue
		}
		m, err := st.GetLastMsgForSubject(ctx, natsx.EventsSubject(p, o.sensorID))
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
			last[o.sensorID] = 0
		case err != nil:
			return nil, nil, fmt.Errorf("last event of sensor %s: %w", o.sensorID, err)
		default:
			// Anyone can publish to EVENTS: a last message that is not a real event of the
			// sensor (garbage, or a forged revision meant to make these rows look published)
			// says nothing; the rows are published, at worst again (receivers and the
			// notifier de-duplicate by event id), never dropped.
			ev, err := event.CheckEvent(m.Subject, m.Data, r.cfg.PartitionCount)
			if err != nil {
				r.log.Warn("the last EVENTS message of a sensor is not a real event; its outbox rows are published",
					"partition", p, "sensor", o.sensorID, "seq", m.Sequence, "err", err)
				last[o.sensorID] = 0
				continue
			}
			last[o.sensorID] = ev.Revision
		}
	}
	if err := r.dropForged(ctx, p, last); err != nil {
		return nil, nil, err
	}
	keep := all[:0]
	for _, o := range all {
		if o.revision <= last[o.sensorID] {
			done = append(done, o.id)
			continue
		}
		keep = append(keep, o)
	}
	if n := len(done); n > 0 {
		r.log.Info("outbox rows already in EVENTS are deleted without publishing", "partition", p, "rows", n)
	}
	return keep, done, nil
}

// dropForged forgets a last revision that the sensor's state has not reached: the outbox is
// written with the state, so only a forged event can be ahead of it (a sane revision the
// structural check lets through).
func (r *Relay) dropForged(ctx context.Context, p int, last map[string]int64) error {
	ids := make([]string, 0, len(last))
	for id, rev := range last {
		if rev > 0 {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	state, err := staterev.Of(ctx, r.pg, ids)
	if err != nil {
		return err
	}
	for _, id := range ids {
		if last[id] > state[id] {
			r.log.Warn("the last EVENTS message of a sensor is ahead of its state: forged; its outbox rows are published",
				"partition", p, "sensor", id, "revision", last[id], "state_revision", state[id])
			last[id] = 0
		}
	}
	return nil
}
