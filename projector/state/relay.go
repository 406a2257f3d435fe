package state

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/lock-sensors/lock-sensors/internal/backoff"
	"github.com/lock-sensors/lock-sensors/internal/crashpoint"
	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/outbox"
	"github.com/lock-sensors/lock-sensors/internal/stage"
	"github.com/lock-sensors/lock-sensors/internal/staterev"
)

// The outbox of a partition, read by that partition's owner only.
const (
	relaySelect = `SELECT id, revision, event_id, sensor_id, payload, created_at, coalesce(traceparent, '') FROM outbox
		WHERE partition = $1 ORDER BY id LIMIT $2`
	relayDelete = `DELETE FROM outbox WHERE id = ANY($1)`
)

// Relay publishes the outbox rows of the owned partitions to EVENTS through one
// internal/outbox relay per partition: in id order, the event id as Nats-Msg-Id, a sensor's
// events never two in flight (the sensor is the row's key), each row deleted only after
// JetStream acknowledged it. Rows a crash left behind are checked against EVENTS first
// (check), so they are neither lost nor doubled.
type Relay struct {
	js     jetstream.JetStream
	pg     *pgxpool.Pool
	log    *slog.Logger
	counts int // the stream's partition count, for checking events
	relays map[int]*outbox.Relay

	published prometheus.Counter
	latency   prometheus.Histogram
	stage     stage.Observer
}

func newRelay(cfg Config, d Deps) (*Relay, error) {
	r := &Relay{js: d.JS, pg: d.PG, log: d.Logger.With("part", "relay"), counts: cfg.PartitionCount,
		relays: make(map[int]*outbox.Relay, len(cfg.candidates())),
		published: prometheus.NewCounter(prometheus.CounterOpts{Name: "locks_relay_published_total",
			Help: "Outbox rows published to EVENTS and deleted."}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "locks_relay_event_age_seconds",
			Help: "Time from an event's commit to the outbox until JetStream acknowledged it.", Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 12)}),
	}
	for _, c := range []prometheus.Collector{r.published, r.latency} {
		if err := d.Registerer.Register(c); err != nil {
			return nil, fmt.Errorf("relay metrics: %w", err)
		}
	}
	var err error
	if r.stage, err = stage.New(d.Registerer, stage.Relay); err != nil {
		return nil, err
	}
	for _, p := range cfg.candidates() {
		or, err := outbox.New(outbox.Config{
			Name:       "events p" + strconv.Itoa(p),
			Table:      outbox.Table{Select: relaySelect, Args: []any{p}, Scan: scanEventRow(p), Delete: relayDelete},
			Batch:      cfg.RelayBatch,
			Poll:       cfg.RelayPoll,
			AckTimeout: cfg.PublishTimeout,
			Backoff:    backoff.Policy{Min: retryMin, Max: retryMax},
			Check: func(ctx context.Context, rows []outbox.Row) ([]outbox.Row, []int64, error) {
				return r.check(ctx, p, rows)
			},
			Published: r.observe,
		}, outbox.Deps{Logger: d.Logger, JS: d.JS, PG: d.PG,
			Registerer: prometheus.WrapRegistererWith(prometheus.Labels{"outbox": "events_p" + strconv.Itoa(p)}, d.Registerer)})
		if err != nil {
			return nil, err
		}
		r.relays[p] = or
	}
	return r, nil
}

// scanEventRow reads an outbox row of partition p as an EVENTS message keyed by its sensor.
func scanEventRow(p int) func(pgx.Rows) (outbox.Row, error) {
	return func(rows pgx.Rows) (outbox.Row, error) {
		var o outbox.Row
		err := rows.Scan(&o.ID, &o.Seq, &o.MsgID, &o.Key, &o.Data, &o.Created, &o.Traceparent)
		o.Subject = natsx.EventsSubject(p, o.Key)
		return o, err
	}
}

// run relays partition p until ctx is done.
func (r *Relay) run(ctx context.Context, p int) error { return r.relays[p].Run(ctx) }

// wake starts a round of partition p's relay soon: its owner has just committed rows.
func (r *Relay) wake(p int) {
	if or, ok := r.relays[p]; ok {
		or.Wake()
	}
}

func (r *Relay) observe(rows []outbox.Row) {
	for _, o := range rows {
		r.latency.Observe(time.Since(o.Created).Seconds())
		r.stage.Since(o.Created)
	}
	r.published.Add(float64(len(rows)))
	crashpoint.Hit(CrashRelayAfterPublish)
}

// check keeps the rows whose event EVENTS does not hold yet. JetStream's de-duplication
// window catches a quick republish, but not one after a long outage, so each sensor's last
// event in EVENTS is looked up and rows at or below its revision are dropped unpublished.
func (r *Relay) check(ctx context.Context, p int, rows []outbox.Row) ([]outbox.Row, []int64, error) {
	st, err := natsx.Stream(ctx, r.js, natsx.EventsStream)
	if err != nil {
		return nil, nil, fmt.Errorf("look up %s: %w", natsx.EventsStream, err)
	}
	last := make(map[string]int64)
	for _, o := range rows {
		if _, ok := last[o.Key]; ok {
			continue
		}
		gctx, cancel := context.WithTimeout(ctx, natsx.RequestTimeout)
		m, err := st.GetLastMsgForSubject(gctx, natsx.EventsSubject(p, o.Key))
		cancel()
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
			last[o.Key] = 0
		case err != nil:
			return nil, nil, fmt.Errorf("last event of sensor %s: %w", o.Key, err)
		default:
			// Anyone can publish to EVENTS: a last message that is not a real event of the
			// sensor (garbage, or a forged revision meant to make these rows look published)
			// says nothing; the rows are published, at worst again (receivers and the
			// notifier de-duplicate by event id), never dropped.
			ev, err := event.CheckEvent(m.Subject, m.Data, r.counts)
			if err != nil {
				r.log.Warn("the last EVENTS message of a sensor is not a real event; its outbox rows are published",
					"partition", p, "sensor", o.Key, "seq", m.Sequence, "err", err)
				last[o.Key] = 0
				continue
			}
			last[o.Key] = ev.Revision
		}
	}
	if err := r.dropForged(ctx, p, last); err != nil {
		return nil, nil, err
	}
	keep := rows[:0]
	var drop []int64
	for _, o := range rows {
		if o.Seq <= last[o.Key] {
			drop = append(drop, o.ID)
			continue
		}
		keep = append(keep, o)
	}
	if len(drop) > 0 {
		r.log.Info("outbox rows already in EVENTS are deleted without publishing", "partition", p, "rows", len(drop))
	}
	return keep, drop, nil
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
