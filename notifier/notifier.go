package notifier

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/lock-sensors/lock-sensors/internal/config"
	"github.com/lock-sensors/lock-sensors/internal/crashpoint"
	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/partition"
	"github.com/lock-sensors/lock-sensors/internal/setaside"
)

// Crash points, for tests that kill the notifier at its worst moments.
const (
	// CrashAfterIngestCommit: deliveries committed, EVENTS messages not acknowledged.
	CrashAfterIngestCommit = "notifier.after_ingest_commit"
	// CrashAfterFinishCommit: attempt outcomes (and next attempt times) committed, records not relayed.
	CrashAfterFinishCommit = "notifier.after_finish_commit"
)

// Options tune capacity and isolation; zero fields take the defaults.
type Options struct {
	// MaxInFlight bounds this process's concurrent attempts (default 512).
	MaxInFlight int
	// PerEndpoint is where one client's limit of concurrent attempts in this process starts
	// (default 8); it adapts between 1 and 64 (see endpoints).
	PerEndpoint int
	// BreakerThreshold consecutive failures open a client's circuit (default 5).
	BreakerThreshold int
	// BreakerCooldown is how long an open circuit waits before a probe (default 30s), doubling
	// while probes fail, up to BreakerMaxCooldown (default 10m).
	BreakerCooldown    time.Duration
	BreakerMaxCooldown time.Duration
	// PollInterval is the longest the dispatcher sleeps when it knows of nothing due; it is
	// how soon a row written by another process is noticed (default 1s).
	PollInterval time.Duration
	// Batch is how many rows one claim, ingest or finish transaction handles (default 256).
	Batch int
	// Retention keeps finished rows (delivered, cancelled, superseded) this long (default 7 days).
	Retention time.Duration
}

func (o *Options) setDefaults() {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	defD := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&o.MaxInFlight, 512)
	def(&o.PerEndpoint, 8)
	def(&o.BreakerThreshold, 5)
	def(&o.Batch, 256)
	defD(&o.BreakerCooldown, 30*time.Second)
	defD(&o.BreakerMaxCooldown, 10*time.Minute)
	defD(&o.PollInterval, time.Second)
	defD(&o.Retention, 7*24*time.Hour)
	o.BreakerMaxCooldown = max(o.BreakerMaxCooldown, o.BreakerCooldown)
}

// Deps are what the notifier is built from.
type Deps struct {
	JS  jetstream.JetStream
	DB  DB
	Log *slog.Logger
	Reg prometheus.Registerer
	// Partitions of EVENTS this process consumes; nil means all of cfg.Partitions.
	// Sending is shared by every notifier process through the delivery table.
	Partitions partition.Set
	Options    Options
}

// Notifier consumes EVENTS and delivers webhooks.
type Notifier struct {
	js     jetstream.JetStream
	db     DB
	log    *slog.Logger
	parts  partition.Set
	opt    Options
	policy Policy
	lease  time.Duration
	send   *sender
	ep     *endpoints
	m      metrics

	inflight  atomic.Int64
	results   chan result
	wake      chan struct{}
	slotFreed chan struct{}
	relayWake chan struct{}
	ran       atomic.Bool
	// partitionCount is LOCKS_PARTITIONS, for the subject check of EVENTS messages.
	partitionCount int
	// setAside records the EVENTS messages that are not real events (see checkBatch).
	setAside *setaside.Recorder
}

type metrics struct {
	events   prometheus.Counter
	created  prometheus.Counter
	outcomes *prometheus.CounterVec
	latency  *prometheus.HistogramVec
	lag      prometheus.Histogram
	inflight prometheus.GaugeFunc
	breaker  prometheus.Counter
}

// New builds a notifier from the configuration (RetrySchedule, WebhookTimeout,
// WebhookAllowPrivate, Partitions) and deps.
func New(cfg config.Config, d Deps) (*Notifier, error) {
	switch {
	case d.JS == nil:
		return nil, errors.New("notifier: nil JetStream")
	case d.DB == nil:
		return nil, errors.New("notifier: nil Postgres")
	case d.Log == nil:
		return nil, errors.New("notifier: nil logger")
	case d.Reg == nil:
		return nil, errors.New("notifier: nil metrics registerer")
	case cfg.WebhookTimeout <= 0:
		return nil, fmt.Errorf("notifier: webhook timeout must be positive, got %s", cfg.WebhookTimeout)
	}
	for _, s := range cfg.RetrySchedule {
		if s <= 0 {
			return nil, fmt.Errorf("notifier: retry schedule has a non-positive delay %s", s)
		}
	}
	parts := d.Partitions
	if parts == nil {
		if cfg.Partitions < 1 {
			return nil, fmt.Errorf("notifier: partitions must be >= 1, got %d", cfg.Partitions)
		}
		parts = partition.All(cfg.Partitions)
	}
	opt := d.Options
	opt.setDefaults()
	n := &Notifier{
		js: d.JS, db: d.DB, log: d.Log.With("part", "notifier"), parts: parts, opt: opt,
		policy:    Policy{Schedule: append([]time.Duration(nil), cfg.RetrySchedule...)},
		lease:     cfg.WebhookTimeout + 30*time.Second,
		send:      newSender(cfg.WebhookTimeout, cfg.WebhookAllowPrivate),
		ep:        newEndpoints(opt.PerEndpoint, opt.BreakerThreshold, opt.BreakerCooldown, opt.BreakerMaxCooldown),
		results:   make(chan result, 2*opt.MaxInFlight),
		wake:      make(chan struct{}, 1),
		slotFreed: make(chan struct{}, 1),
		relayWake: make(chan struct{}, 1),
	}
	n.m = metrics{
		events: prometheus.NewCounter(prometheus.CounterOpts{Name: "locks_notifier_events_total",
			Help: "EVENTS messages consumed by the notifier."}),
		created: prometheus.NewCounter(prometheus.CounterOpts{Name: "locks_notifier_deliveries_created_total",
			Help: "Deliveries created (one per event and subscribed client)."}),
		outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "locks_notifier_attempts_total",
			Help: "Webhook attempts recorded, by outcome (delivered, retry, dead, cancelled, superseded)."}, []string{"outcome"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "locks_notifier_attempt_duration_seconds",
			Help:    "Duration of webhook HTTP attempts, by result (2xx, 3xx, 4xx, 5xx, error).",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}}, []string{"result"}),
		lag: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "locks_notifier_delivery_lag_seconds",
			Help:    "From an event's occurred_at to its successful delivery.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2.5, 16)}),
		inflight: prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "locks_notifier_inflight_attempts",
			Help: "Webhook attempts in flight in this process."}, func() float64 { return float64(n.inflight.Load()) }),
		breaker: prometheus.NewCounter(prometheus.CounterOpts{Name: "locks_notifier_breaker_opened_total",
			Help: "Times a client's circuit breaker opened."}),
	}
	for _, c := range []prometheus.Collector{n.m.events, n.m.created, n.m.outcomes, n.m.latency, n.m.lag, n.m.inflight, n.m.breaker} {
		if err := d.Reg.Register(c); err != nil {
			return nil, fmt.Errorf("notifier: register metrics: %w", err)
		}
	}
	n.partitionCount = cfg.Partitions
	var err error
	if n.setAside, err = setaside.NewRecorder(SetAsideConsumer, d.JS, n.log, d.Reg); err != nil {
		return nil, err
	}
	return n, nil
}

func poke(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// Run consumes EVENTS and sends webhooks until ctx is done; then it stops claiming, aborts
// the attempts in flight (their leases are released, they are not counted), writes the
// outcomes it has and relays the records. It can be called once.
func (n *Notifier) Run(ctx context.Context) error {
	if !n.ran.CompareAndSwap(false, true) {
		return errors.New("notifier: Run called twice")
	}
	var bg sync.WaitGroup
	bg.Go(func() { n.ingest(ctx) })
	bg.Go(func() { n.janitor(ctx) })
	relayCtx, stopRelay := context.WithCancel(context.WithoutCancel(ctx))
	var relayDone sync.WaitGroup
	relayDone.Go(func() { n.relay(relayCtx) })
	var finDone sync.WaitGroup
	finDone.Go(n.finisher)

	n.dispatch(ctx)
	close(n.results)
	finDone.Wait()
	stopRelay()
	relayDone.Wait()
	bg.Wait()
	n.log.Info("notifier stopped")
	return nil
}

// sleep waits d or until ctx is done; it reports whether ctx is still alive.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// ingest turns EVENTS messages into delivery rows, acknowledging each message only after
// its rows are committed.
func (n *Notifier) ingest(ctx context.Context) {
	msgs := make(chan jetstream.Msg, 4*n.opt.Batch)
	var ccs []jetstream.ConsumeContext
	defer func() {
		for _, cc := range ccs {
			cc.Stop()
		}
	}()
	for _, p := range n.parts {
		for {
			cc, err := n.consume(ctx, p, msgs)
			if err == nil {
				ccs = append(ccs, cc)
				break
			}
			n.log.Warn("cannot consume EVENTS yet; retrying", "partition", p, "err", err)
			if !sleep(ctx, time.Second) {
				return
			}
		}
	}
	n.log.Info("consuming EVENTS", "partitions", fmt.Sprint(n.parts))
	batch := make([]jetstream.Msg, 0, n.opt.Batch)
	for {
		batch = batch[:0]
		select {
		case m := <-msgs:
			batch = append(batch, m)
		case <-ctx.Done():
			return
		}
	more:
		for len(batch) < n.opt.Batch {
			select {
			case m := <-msgs:
				batch = append(batch, m)
			default:
				break more
			}
		}
		for backoff := 100 * time.Millisecond; ; backoff = min(2*backoff, 5*time.Second) {
			err := n.ingestBatch(ctx, batch)
			if err == nil {
				break
			}
			n.log.Error("ingest EVENTS batch failed; retrying", "messages", len(batch), "err", err)
			if !sleep(ctx, backoff) {
				return // unacknowledged: redelivered to whoever consumes next
			}
		}
	}
}

func (n *Notifier) consume(ctx context.Context, p int, msgs chan<- jetstream.Msg) (jetstream.ConsumeContext, error) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cons, err := n.js.CreateOrUpdateConsumer(cctx, natsx.EventsStream, jetstream.ConsumerConfig{
		Durable:       "notifier-" + strconv.Itoa(p),
		Description:   "webhook notifier, partition " + strconv.Itoa(p),
		FilterSubject: natsx.EventsPartitionFilter(p),
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       30 * time.Second,
		MaxAckPending: 8 * n.opt.Batch,
		DeliverPolicy: jetstream.DeliverAllPolicy,
	})
	if err != nil {
		return nil, fmt.Errorf("consumer for partition %d: %w", p, err)
	}
	return cons.Consume(func(m jetstream.Msg) {
		select {
		case msgs <- m:
		case <-ctx.Done():
		}
	}, jetstream.PullMaxMessages(2*n.opt.Batch), jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
		n.log.Debug("EVENTS consumer", "partition", p, "err", err)
	}))
}

func (n *Notifier) ingestBatch(ctx context.Context, batch []jetstream.Msg) error {
	evs, payloads, ok, err := n.checkBatch(ctx, batch)
	if err != nil {
		return err
	}
	if len(evs) == 0 {
		return nil
	}
	var created int
	var recs []event.Attempt
	err = pgx.BeginFunc(ctx, n.db, func(tx pgx.Tx) error {
		var err error
		created, recs, err = insertDeliveries(ctx, tx, evs, payloads)
		if err != nil {
			return err
		}
		return writeOutbox(ctx, tx, recs)
	})
	if err != nil {
		return err
	}
	crashpoint.Hit(CrashAfterIngestCommit)
	for _, m := range ok {
		if err := m.Ack(); err != nil {
			// Redelivered later and skipped by (event_id, client_id): harmless.
			n.log.Debug("ack EVENTS message", "err", err)
		}
	}
	n.m.events.Add(float64(len(evs)))
	n.m.created.Add(float64(created))
	n.count(recs)
	poke(n.wake)
	if len(recs) > 0 {
		poke(n.relayWake)
	}
	return nil
}

func (n *Notifier) count(recs []event.Attempt) {
	for _, a := range recs {
		n.m.outcomes.WithLabelValues(a.Outcome).Inc()
	}
}

// dispatch claims due deliveries and starts their attempts, within the global and
// per-endpoint limits, until ctx is done and every attempt it started has ended.
func (n *Notifier) dispatch(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	backoff := 100 * time.Millisecond
	busyLoop := false
	for ctx.Err() == nil {
		free := n.opt.MaxInFlight - int(n.inflight.Load())
		if free <= 0 {
			select {
			case <-n.slotFreed:
			case <-ctx.Done():
			}
			continue
		}
		if free < n.opt.MaxInFlight/4 && busyLoop {
			// Claiming for one or two free slots at a time would cost a claim per delivery:
			// let a quarter of the slots free up first, but not for long.
			t := time.NewTimer(2 * time.Millisecond)
			for free < n.opt.MaxInFlight/4 {
				select {
				case <-n.slotFreed:
					free = n.opt.MaxInFlight - int(n.inflight.Load())
					continue
				case <-t.C:
				case <-ctx.Done():
				}
				break
			}
			t.Stop()
		}
		now := time.Now()
		cs, err := claim(ctx, n.db, n.ep.capacity(now), min(free, n.opt.Batch), rand.Int64(), n.lease)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			n.log.Error("claim deliveries", "err", err)
			sleep(ctx, backoff)
			backoff = min(2*backoff, 5*time.Second)
			continue
		}
		backoff = 100 * time.Millisecond
		var excess []claimed
		started := 0
		for _, c := range cs {
			if c.url == "" || !c.subscribed {
				why := "client deleted"
				if c.url != "" {
					why = "client unsubscribed from the sensor"
				}
				n.results <- result{c: c, state: StateCancelled, errText: why, at: now}
				started++
				continue
			}
			if !n.ep.acquire(c.clientID, now) {
				excess = append(excess, c)
				continue
			}
			started++
			n.inflight.Add(1)
			wg.Go(func() {
				r := n.attempt(ctx, c)
				if !r.aborted && n.ep.release(c.clientID, r.state == StateDelivered, r.latency, time.Now()) {
					n.m.breaker.Inc()
					n.log.Warn("circuit opened for a failing webhook endpoint", "client", c.clientID, "status", r.status, "err", r.errText)
				} else if r.aborted {
					n.ep.release(c.clientID, true, 0, time.Now())
				}
				n.inflight.Add(-1)
				poke(n.slotFreed)
				n.results <- r
			})
		}
		if len(excess) > 0 {
			uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			if err := unlease(uctx, n.db, excess); err != nil {
				n.log.Warn("release unsent claims (their leases will expire)", "err", err)
			}
			cancel()
		}
		busyLoop = started > 0
		if started > 0 {
			continue
		}
		wait := nextDue(ctx, n.db, n.opt.PollInterval)
		t := time.NewTimer(max(wait, time.Millisecond))
		select {
		case <-n.wake:
		case <-n.slotFreed:
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
	}
}

// webhookBody is the JSON body of CONTRACT.md section 2, fields in the documented order.
type webhookBody struct {
	ID           string        `json:"id"`
	Type         string        `json:"type"`
	OccurredAt   string        `json:"occurred_at"`
	Sensor       webhookSensor `json:"sensor"`
	Data         uint8         `json:"data"`
	PreviousData *uint8        `json:"previous_data"`
	Revision     int64         `json:"revision"`
}

type webhookSensor struct {
	ID      string `json:"id"`
	Address string `json:"address"`
}

// Body is the webhook body of e for a sensor at address.
func Body(e event.Event, address string) ([]byte, error) {
	return json.Marshal(webhookBody{
		ID: e.ID, Type: "sensor." + e.Type,
		OccurredAt: e.OccurredAt.UTC().Format("2006-01-02T15:04:05.000Z07:00"),
		Sensor:     webhookSensor{ID: e.SensorID, Address: address},
		Data:       e.Data, PreviousData: e.PreviousData, Revision: e.Revision,
	})
}

func statusClass(status int, err error) string {
	if err != nil || status < 100 {
		return "error"
	}
	return strconv.Itoa(status/100) + "xx"
}

// attempt makes one HTTP attempt of c and decides what follows.
func (n *Notifier) attempt(ctx context.Context, c claimed) result {
	start := time.Now()
	r := result{c: c, at: start}
	fail := func(msg string) result {
		r.errText = msg
		k := c.attempts + 1 - c.attemptBase // this attempt's number within its schedule
		d := n.policy.Delay(k, rand.Float64(), RetryAfter(r.status, r.retryAfter, time.Now()))
		if d == Stop {
			r.state = StateDead
		} else {
			r.state, r.delay = StatePending, d
		}
		return r
	}
	e, err := event.DecodeEvent(c.payload)
	if err != nil {
		r.state, r.errText = StateDead, err.Error() // can never be sent
		return r
	}
	body, err := Body(e, c.address)
	if err != nil {
		r.state, r.errText = StateDead, err.Error()
		return r
	}
	ts := start.Unix()
	sig, err := Signature(c.secret, c.previous, c.previousUntil, start, c.eventID, ts, body)
	if err != nil {
		return fail(err.Error())
	}
	h := http.Header{}
	h.Set("Content-Type", "application/json")
	h.Set("User-Agent", "lock-sensors-webhooks/1")
	h["webhook-id"] = []string{c.eventID}
	h["webhook-timestamp"] = []string{strconv.FormatInt(ts, 10)}
	h["webhook-signature"] = []string{sig}
	resp, err := n.send.post(ctx, c.url, h, body)
	r.latency = time.Since(start)
	r.status = resp.status
	r.retryAfter = resp.retryAfter
	if err != nil && ctx.Err() != nil {
		r.aborted = true // our shutdown, not the receiver's failure
		return r
	}
	n.m.latency.WithLabelValues(statusClass(resp.status, err)).Observe(r.latency.Seconds())
	switch {
	case err != nil:
		return fail(err.Error())
	case resp.status >= 200 && resp.status < 300:
		r.state = StateDelivered
		n.m.lag.Observe(time.Since(e.OccurredAt).Seconds())
		return r
	default:
		return fail("HTTP " + strconv.Itoa(resp.status))
	}
}

// finisher writes attempt outcomes in batches until results is closed.
func (n *Notifier) finisher() {
	batch := make([]result, 0, n.opt.Batch)
	for r := range n.results {
		batch = append(batch[:0], r)
		// Wait a moment for more (one transaction per outcome would cost far more than the
		// wait), but only while results keep coming: a lone outcome is written at once.
		linger := time.NewTimer(2 * time.Millisecond)
	more:
		for len(batch) < 2*n.opt.Batch {
			select {
			case r, ok := <-n.results:
				if !ok {
					break more
				}
				batch = append(batch, r)
				continue
			default:
			}
			if len(batch) == 1 || n.inflight.Load() == 0 {
				break
			}
			select {
			case r, ok := <-n.results:
				if !ok {
					break more
				}
				batch = append(batch, r)
			case <-linger.C:
				break more
			}
		}
		linger.Stop()
		n.finishBatch(batch)
	}
}

func (n *Notifier) finishBatch(batch []result) {
	for try, backoff := 1, 100*time.Millisecond; ; try, backoff = try+1, min(2*backoff, 2*time.Second) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		recs, err := finish(ctx, n.db, batch)
		cancel()
		if err == nil {
			crashpoint.Hit(CrashAfterFinishCommit)
			n.count(recs)
			poke(n.wake)
			poke(n.relayWake)
			return
		}
		if try >= 10 {
			// The leases expire and the deliveries are attempted again: at least once.
			n.log.Error("cannot record attempt outcomes; they will be retried after their leases expire",
				"attempts", len(batch), "err", err)
			return
		}
		n.log.Warn("record attempt outcomes; retrying", "try", try, "err", err)
		time.Sleep(backoff)
	}
}

// relay moves attempt records from the outbox to DELIVERIES. Records are published with
// their Nats-Msg-Id and deleted only after JetStream acknowledged them.
func (n *Notifier) relay(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		for {
			moved, err := n.relayOnce(ctx)
			if err != nil {
				if ctx.Err() == nil {
					n.log.Warn("relay attempt records to DELIVERIES", "err", err)
				}
				break
			}
			if moved < n.opt.Batch {
				break
			}
		}
		// Records need not be instant: letting them gather for a moment makes each relay
		// transaction carry many instead of one per finished batch.
		sleep(ctx, 20*time.Millisecond)
		select {
		case <-n.relayWake:
		case <-t.C:
		case <-ctx.Done():
			// One last pass for what the finisher wrote while stopping.
			fctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			_, _ = n.relayOnce(fctx)
			cancel()
			return
		}
	}
}

func (n *Notifier) relayOnce(ctx context.Context) (int, error) {
	moved := 0
	err := pgx.BeginFunc(ctx, n.db, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT id, client_id, msg_id, payload FROM notifier_attempt_outbox
			ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED`, n.opt.Batch)
		if err != nil {
			return err
		}
		obs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (outboxRow, error) {
			var o outboxRow
			err := r.Scan(&o.id, &o.clientID, &o.msgID, &o.payload)
			return o, err
		})
		if err != nil || len(obs) == 0 {
			return err
		}
		futs := make([]jetstream.PubAckFuture, 0, len(obs))
		for _, o := range obs {
			f, err := n.js.PublishMsgAsync(&nats.Msg{Subject: natsx.DeliveriesSubject(o.clientID), Data: o.payload},
				jetstream.WithMsgID(o.msgID))
			if err != nil {
				return fmt.Errorf("publish attempt record: %w", err)
			}
			futs = append(futs, f)
		}
		ids := make([]int64, 0, len(obs))
		timeout := time.NewTimer(10 * time.Second)
		defer timeout.Stop()
		for i, f := range futs {
			select {
			case <-f.Ok():
				ids = append(ids, obs[i].id)
			case err := <-f.Err():
				n.log.Warn("attempt record not stored; will retry", "msg_id", obs[i].msgID, "err", err)
			case <-timeout.C:
				return errors.New("DELIVERIES did not acknowledge attempt records within 10s")
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		if _, err := tx.Exec(ctx, `DELETE FROM notifier_attempt_outbox WHERE id = ANY($1)`, ids); err != nil {
			return err
		}
		moved = len(obs)
		return nil
	})
	return moved, err
}

// janitor supersedes rows left behind by crashed processes, and forgets finished rows after
// the retention (dead rows stay until redriven).
func (n *Notifier) janitor(ctx context.Context) {
	t := time.NewTicker(5 * time.Second)
	defer t.Stop()
	last := time.Time{}
	for {
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
		var recs []event.Attempt
		err := pgx.BeginFunc(ctx, n.db, func(tx pgx.Tx) error {
			var err error
			if recs, err = supersede(ctx, tx, nil, nil); err != nil {
				return err
			}
			return writeOutbox(ctx, tx, recs)
		})
		if err != nil {
			if ctx.Err() == nil {
				n.log.Warn("supersede sweep", "err", err)
			}
			continue
		}
		n.count(recs)
		if time.Since(last) > time.Hour {
			last = time.Now()
			_, err := n.db.Exec(ctx, `DELETE FROM notifier_deliveries
				WHERE state IN ('delivered', 'cancelled', 'superseded') AND updated_at < now() - $1 * interval '1 microsecond'`,
				n.opt.Retention.Microseconds())
			if err != nil && ctx.Err() == nil {
				n.log.Warn("delete finished deliveries past retention", "err", err)
			}
		}
	}
}
