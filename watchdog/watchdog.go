package watchdog

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/lock-sensors/lock-sensors/internal/crashpoint"
	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/partition"
	"github.com/lock-sensors/lock-sensors/internal/setaside"
)

// Config is what the watchdog needs besides its dependencies.
type Config struct {
	// Partitions is the partition count of READINGS (LOCKS_PARTITIONS).
	Partitions int
	// Owned is the partitions this process watches; empty means all.
	Owned partition.Set
	// LostAfter is the default silence after which a sensor is lost (LOCKS_LOST_AFTER).
	LostAfter time.Duration
	// SweepEvery is the period of the reconciliation sweep (default 5m).
	SweepEvery time.Duration
	// OverridesEvery is how often per-sensor lost_after overrides are reloaded (default 30s).
	OverridesEvery time.Duration
	// HoldCheckEvery is how often held expiries are re-examined (default 200ms).
	HoldCheckEvery time.Duration
	// Concurrency bounds the expiries examined at once (default 512).
	Concurrency int
	// CatchUpGrace is how long the upstream must have been caught up after it was behind
	// before held expiries are declared (default 2s): a drained queue's last messages may
	// still be on their way through the bridge into READINGS.
	CatchUpGrace time.Duration
	// Durable is the prefix of the READINGS consumer names (default "watchdog"): one per
	// partition, "<Durable>-<p>".
	Durable string
	// MaxHold bounds how long an expiry is held while the pipeline is behind; past it the
	// sensor is declared anyway (LOCKS_WATCHDOG_MAX_HOLD, default MaxHoldDefault).
	MaxHold time.Duration
	// PruneEvery is how often the per-sensor refresh deadlines that have passed are
	// forgotten (default 1m).
	PruneEvery time.Duration
}

func (c *Config) setDefaults() {
	if c.SweepEvery <= 0 {
		c.SweepEvery = 5 * time.Minute
	}
	if c.OverridesEvery <= 0 {
		c.OverridesEvery = 30 * time.Second
	}
	if c.HoldCheckEvery <= 0 {
		c.HoldCheckEvery = 200 * time.Millisecond
	}
	if c.Concurrency <= 0 {
		c.Concurrency = 512
	}
	if c.CatchUpGrace <= 0 {
		c.CatchUpGrace = 2 * time.Second
	}
	if c.Durable == "" {
		c.Durable = "watchdog"
	}
	if c.MaxHold <= 0 {
		c.MaxHold = MaxHoldDefault
	}
	if c.PruneEvery <= 0 {
		c.PruneEvery = time.Minute
	}
	if len(c.Owned) == 0 {
		c.Owned = partition.All(c.Partitions)
	}
}

// Validate reports the first unusable value.
func (c Config) Validate() error {
	switch {
	case c.Partitions < 1:
		return fmt.Errorf("watchdog: partitions must be >= 1, got %d", c.Partitions)
	case c.LostAfter < time.Second:
		// Per-message TTLs are whole seconds on the server.
		return fmt.Errorf("watchdog: lost_after must be >= 1s, got %s", c.LostAfter)
	}
	for _, p := range c.Owned {
		if p < 0 || p >= c.Partitions {
			return fmt.Errorf("watchdog: owned partition %d out of range 0-%d", p, c.Partitions-1)
		}
	}
	return nil
}

// LagFunc tells whether the pipeline upstream of READINGS (the bridge and its RabbitMQ
// queue) is behind: readings exist that are not in the log yet. An error counts as behind.
type LagFunc func(ctx context.Context) (behind bool, err error)

// Deps are the watchdog's dependencies; all are required.
type Deps struct {
	JS  jetstream.JetStream
	PG  *pgxpool.Pool
	Log *slog.Logger
	Reg prometheus.Registerer
	// Lag is asked before held expiries are declared; see RabbitLag.
	Lag LagFunc
}

// SetAsideConsumer names the watchdog in set-aside records and their metric.
const SetAsideConsumer = "watchdog"

// Watchdog turns expired liveness keys into liveness_timeout facts. See the package doc.
type Watchdog struct {
	cfg   Config
	js    jetstream.JetStream
	pg    *pgxpool.Pool
	log   *slog.Logger
	lag   LagFunc
	owned []bool
	// setAside records the READINGS messages that can never refresh a key.
	setAside *setaside.Recorder

	overrides atomic.Pointer[map[string]time.Duration]

	// parts holds per-partition progress of the READINGS consumers.
	parts map[int]*partState

	// lastBehind is when the upstream was last seen behind; lagErr whether the last ask failed.
	lagMu      sync.Mutex
	lastBehind time.Time
	lagErr     bool
	reconnects uint64 // of our NATS connection, when last looked

	mu   sync.Mutex
	held map[string]candidate
	// heldPeak is the most entries held since the map was last made, to know when
	// shrinking it gives memory back.
	heldPeak int
	wake     chan struct{}

	m metrics
}

// candidate is an expiry seen and not yet settled.
type candidate struct {
	rev uint64    // KV revision of the marker (or of what the sweep found; 0: no message)
	at  time.Time // server time of the marker
	// expect: the key must still be at rev when we write it (always, but for a hand-made
	// candidate in tests).
	expect bool
	// heldSince is when this process first held the sensor's expiry (set by addCandidate).
	// It counts from here, not from the marker, so that markers replayed after a restart
	// into a backlog are held for MaxHold like fresh ones.
	heldSince time.Time
	// overdue: settled because it was held for MaxHold, not because the pipeline caught up.
	overdue bool
}

type partState struct {
	cons jetstream.Consumer
	// doneTS is the stored time (unix ns) of the last READINGS message whose refresh is
	// acknowledged: every reading stored before it has refreshed its key.
	doneTS atomic.Int64
	// doneSeq is the READINGS sequence of that message.
	doneSeq atomic.Uint64
	mu      sync.Mutex
	// writtenMu guards written and writtenPeak: the consumer goroutine writes, the pruner
	// and settle delete.
	writtenMu sync.Mutex
	// written is, per sensor, the deadline (receive time + lost_after) of the last refresh
	// this process sent, in unix seconds rounded up. Only for coalescing: an entry missing
	// costs one key write more, never a missed expiry, so entries are dropped once their
	// deadline has passed. Key and value hold no pointer (see sensorKey), so a million
	// tracked sensors cost about 50 MB (BenchmarkWrittenMap) and nothing for the GC to scan.
	written map[sensorKey]uint32
	// writtenPeak is the most entries since written was last made (see pruneWritten).
	writtenPeak int
}

// coalesceSlack is how far a sensor's deadline may move before its key is written again.
// A reporting sensor then costs a KV write per lost_after/4 instead of one per reading (the
// refresh is most of the watchdog's load on NATS). Skipping is safe because an expiry is
// always settled against the sensor's last message in READINGS: a key that expires up to
// the slack early finds a reading younger than lost_after and is refreshed with the time
// left, so the fact still comes on time. Short timeouts (tests, demos) write every reading,
// since the refresh-on-check rounds its TTL up to a whole second.
func coalesceSlack(lostAfter time.Duration) time.Duration {
	if lostAfter < time.Minute {
		return 0
	}
	return lostAfter / 4
}

// needsRefresh says whether a reading received at received must write the sensor's key,
// and records the deadline it writes.
func (w *Watchdog) needsRefresh(ps *partState, sensor string, received time.Time) bool {
	lostAfter := w.lostAfter(sensor)
	slack := coalesceSlack(lostAfter)
	if slack == 0 {
		return true // every reading writes: nothing to remember
	}
	k, ok := keyOfSensor(sensor)
	if !ok {
		return true // not a contract id: not worth remembering, always written
	}
	deadline := received.Add(lostAfter).UnixNano()
	ps.writtenMu.Lock()
	defer ps.writtenMu.Unlock()
	// The stored deadline is rounded up to the second: the true one lies in (lo, lo+1s].
	// Skip only when this one is within the slack of it (the sweep relies on a key standing
	// for a reading at most the slack older than the last) and not earlier than lo (a key
	// may then stand for a reading under a second newer than this one: harmless).
	if d, ok := ps.written[k]; ok {
		lo := int64(d)*int64(time.Second) - int64(time.Second)
		if deadline >= lo && deadline-lo < int64(slack) {
			return false
		}
	}
	if ps.written == nil {
		ps.written = map[sensorKey]uint32{}
	}
	ps.written[k] = ceilSeconds(deadline)
	ps.writtenPeak = max(ps.writtenPeak, len(ps.written))
	return true
}

type metrics struct {
	refreshes, expiries, facts, refreshedOnCheck, alreadyDeclared, repairs prometheus.Counter
	coalesced                                                              prometheus.Counter
	held, oldestHeld                                                       prometheus.Gauge
	declaredAtMaxHold                                                      prometheus.Counter
	delay, markerLag                                                       prometheus.Histogram
}

// ErrNilDep is returned by New for a missing dependency.
var ErrNilDep = errors.New("watchdog: missing dependency")

// New checks cfg and deps and builds a Watchdog; Run starts it.
func New(cfg Config, d Deps) (*Watchdog, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	switch {
	case d.JS == nil:
		return nil, fmt.Errorf("%w: JS", ErrNilDep)
	case d.PG == nil:
		return nil, fmt.Errorf("%w: PG", ErrNilDep)
	case d.Log == nil:
		return nil, fmt.Errorf("%w: Log", ErrNilDep)
	case d.Reg == nil:
		return nil, fmt.Errorf("%w: Reg", ErrNilDep)
	case d.Lag == nil:
		return nil, fmt.Errorf("%w: Lag", ErrNilDep)
	}
	w := &Watchdog{
		cfg: cfg, js: d.JS, pg: d.PG, log: d.Log.With("part", "watchdog"), lag: d.Lag,
		owned: make([]bool, cfg.Partitions),
		parts: map[int]*partState{},
		held:  map[string]candidate{},
		wake:  make(chan struct{}, 1),
	}
	w.reconnects = d.JS.Conn().Stats().Reconnects
	for _, p := range cfg.Owned {
		w.owned[p] = true
		w.parts[p] = &partState{}
	}
	empty := map[string]time.Duration{}
	w.overrides.Store(&empty)
	w.m = metrics{
		refreshes:        prometheus.NewCounter(prometheus.CounterOpts{Name: "locks_watchdog_refreshes_total", Help: "Liveness keys refreshed by readings."}),
		coalesced:        prometheus.NewCounter(prometheus.CounterOpts{Name: "locks_watchdog_refreshes_coalesced_total", Help: "Readings whose key refresh was skipped: the key's deadline was within lost_after/4 of theirs."}),
		expiries:         prometheus.NewCounter(prometheus.CounterOpts{Name: "locks_watchdog_expiries_total", Help: "Liveness key expiries (limit markers) seen."}),
		facts:            prometheus.NewCounter(prometheus.CounterOpts{Name: "locks_watchdog_facts_total", Help: "liveness_timeout facts appended to READINGS."}),
		refreshedOnCheck: prometheus.NewCounter(prometheus.CounterOpts{Name: "locks_watchdog_expiries_refreshed_total", Help: "Expiries dropped because READINGS held a reading younger than lost_after (our own lag)."}),
		alreadyDeclared:  prometheus.NewCounter(prometheus.CounterOpts{Name: "locks_watchdog_expiries_already_declared_total", Help: "Expiries dropped because the sensor's last message already is a liveness_timeout."}),
		repairs:          prometheus.NewCounter(prometheus.CounterOpts{Name: "locks_watchdog_reconcile_repairs_total", Help: "Differences between sensor_state and liveness keys repaired by the sweep; should stay 0."}),
		held:             prometheus.NewGauge(prometheus.GaugeOpts{Name: "locks_watchdog_held_expiries", Help: "Expiries held until the pipeline is caught up."}),
		oldestHeld: prometheus.NewGauge(prometheus.GaugeOpts{Name: "locks_watchdog_held_expiry_oldest_seconds",
			Help: "How long the oldest held expiry has been held (0: none); at LOCKS_WATCHDOG_MAX_HOLD it is declared despite the lag."}),
		declaredAtMaxHold: prometheus.NewCounter(prometheus.CounterOpts{Name: "locks_watchdog_expiries_declared_at_max_hold_total",
			Help: "liveness_timeout facts appended while the pipeline was still behind, because the expiry had been held for LOCKS_WATCHDOG_MAX_HOLD."}),
		delay: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "locks_watchdog_declare_delay_seconds", Help: "From a sensor's deadline (last reading + lost_after) to its fact.",
			Buckets: []float64{.05, .1, .25, .5, 1, 1.5, 2, 5, 10, 30, 60, 300}}),
		markerLag: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "locks_watchdog_marker_lag_seconds", Help: "From a sensor's deadline to the server's expiry marker of its key.",
			Buckets: []float64{.05, .1, .25, .5, 1, 1.5, 2, 5, 10, 30, 60, 300}}),
	}
	for _, c := range []prometheus.Collector{w.m.refreshes, w.m.coalesced, w.m.expiries, w.m.facts, w.m.refreshedOnCheck, w.m.alreadyDeclared, w.m.repairs, w.m.held, w.m.oldestHeld, w.m.declaredAtMaxHold, w.m.delay, w.m.markerLag} {
		if err := d.Reg.Register(c); err != nil {
			return nil, fmt.Errorf("watchdog metrics: %w", err)
		}
	}
	var err error
	if w.setAside, err = setaside.NewRecorder(SetAsideConsumer, d.JS, w.log, d.Reg); err != nil {
		return nil, err
	}
	return w, nil
}

// Run consumes READINGS, watches the bucket, declares expiries and sweeps until ctx is done.
func (w *Watchdog) Run(ctx context.Context) error {
	for {
		if err := w.loadOverrides(ctx); err == nil {
			break
		} else if ctx.Err() != nil {
			return ctx.Err()
		} else {
			w.log.Warn("loading lost_after overrides; retrying", "err", err)
		}
		sleep(ctx, time.Second)
	}
	g, gctx := errgroup.WithContext(ctx)
	for p, ps := range w.parts {
		g.Go(func() error { return w.consume(gctx, p, ps) })
	}
	g.Go(func() error { return w.watch(gctx) })
	g.Go(func() error { return w.declareLoop(gctx) })
	g.Go(func() error {
		return w.every(gctx, w.cfg.OverridesEvery, w.loadOverrides, "reload lost_after overrides")
	})
	g.Go(func() error {
		return w.every(gctx, w.cfg.PruneEvery, func(context.Context) error { w.pruneWritten(time.Now()); return nil }, "prune refresh deadlines")
	})
	g.Go(func() error {
		return w.every(gctx, w.cfg.SweepEvery, func(ctx context.Context) error { _, err := w.Sweep(ctx); return err }, "reconciliation sweep")
	})
	err := g.Wait()
	if ctx.Err() != nil {
		return nil
	}
	return err
}

func (w *Watchdog) every(ctx context.Context, d time.Duration, f func(context.Context) error, what string) error {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			if err := f(ctx); err != nil && ctx.Err() == nil {
				w.log.Warn(what+" failed", "err", err)
			}
		}
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// lostAfter is the timeout in force for a sensor.
func (w *Watchdog) lostAfter(sensor string) time.Duration {
	if d, ok := (*w.overrides.Load())[sensor]; ok {
		return d
	}
	return w.cfg.LostAfter
}

func (w *Watchdog) loadOverrides(ctx context.Context) error {
	rows, err := w.pg.Query(ctx, `SELECT id, lost_after_ms FROM sensors WHERE lost_after_ms IS NOT NULL`)
	if err != nil {
		return fmt.Errorf("read sensors.lost_after_ms: %w", err)
	}
	defer rows.Close()
	m := map[string]time.Duration{}
	for rows.Next() {
		var id string
		var ms int64
		if err := rows.Scan(&id, &ms); err != nil {
			return fmt.Errorf("read sensors.lost_after_ms: %w", err)
		}
		d := time.Duration(ms) * time.Millisecond
		if d < time.Second {
			d = time.Second // the server's TTLs are whole seconds
		}
		m[id] = d
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read sensors.lost_after_ms: %w", err)
	}
	w.overrides.Store(&m)
	return nil
}

// ttlFor is the TTL that makes the key expire lost_after after the reading was received:
// what is left, rounded up to whole seconds (the server's unit) so it never expires early,
// and at least 1 s so an already-overdue sensor expires at once and goes through the check.
func ttlFor(left time.Duration) time.Duration {
	s := (left + time.Second - 1) / time.Second
	if s < 1 {
		s = 1
	}
	return s * time.Second
}

// Key values. A refresh carries the reading's receive time and READINGS sequence; a
// declared sensor's value (no TTL) carries "lost" and the same two, so a restart does not
// declare it again and the sweep can compare.
func encodeValue(received time.Time, seq uint64, lost bool) []byte {
	b := make([]byte, 0, 64)
	b = append(b, `{"received_ns":`...)
	b = strconv.AppendInt(b, received.UnixNano(), 10)
	b = append(b, `,"seq":`...)
	b = strconv.AppendUint(b, seq, 10)
	if lost {
		b = append(b, `,"lost":true`...)
	}
	return append(b, '}')
}

type keyValue struct {
	ReceivedNS int64  `json:"received_ns"`
	Seq        uint64 `json:"seq"`
	Lost       bool   `json:"lost"`
}

// keyOf is a sensor's key: "<partition>.<sensor_id>", so that a process owning some
// partitions watches only their keys.
func keyOf(sensor string, partitions int) string {
	return strconv.Itoa(partition.Of(sensor, partitions)) + "." + sensor
}

const kvPrefix = "$KV." + natsx.LivenessBucket + "."

func (w *Watchdog) kvSubject(sensor string) string { return kvPrefix + keyOf(sensor, w.cfg.Partitions) }

// kvFilters are the bucket subjects of the owned partitions.
func (w *Watchdog) kvFilters() []string {
	if len(w.cfg.Owned) == w.cfg.Partitions {
		return []string{kvPrefix + ">"}
	}
	f := make([]string, 0, len(w.cfg.Owned))
	for _, p := range w.cfg.Owned {
		f = append(f, kvPrefix+strconv.Itoa(p)+".*")
	}
	return f
}

// sensorOfSubject is the sensor of a bucket subject, if it is one of an owned partition.
func (w *Watchdog) sensorOfSubject(subj string) (string, bool) {
	if len(subj) <= len(kvPrefix) {
		return "", false
	}
	p, sensor, ok := strings.Cut(subj[len(kvPrefix):], ".")
	if !ok {
		return "", false
	}
	n, err := strconv.Atoi(p)
	if err != nil || n < 0 || n >= w.cfg.Partitions || !w.owned[n] {
		return "", false
	}
	return sensor, true
}

const kvStream = "KV_" + natsx.LivenessBucket

func (w *Watchdog) refreshMsg(sensor string, received time.Time, seq uint64, now time.Time) (*nats.Msg, time.Duration) {
	ttl := ttlFor(w.lostAfter(sensor) - now.Sub(received))
	return &nats.Msg{Subject: w.kvSubject(sensor), Data: encodeValue(received, seq, false), Header: nats.Header{}}, ttl
}

// consume applies one partition of READINGS to the keys.
func (w *Watchdog) consume(ctx context.Context, p int, ps *partState) error {
	name := w.cfg.Durable + "-" + strconv.Itoa(p)
	for ctx.Err() == nil {
		cons, err := w.js.CreateOrUpdateConsumer(ctx, natsx.ReadingsStream, jetstream.ConsumerConfig{
			Durable:       name,
			Description:   "watchdog: refresh liveness keys",
			FilterSubject: natsx.ReadingsPartitionFilter(p),
			AckPolicy:     jetstream.AckAllPolicy,
			DeliverPolicy: jetstream.DeliverAllPolicy,
			AckWait:       30 * time.Second,
			MaxAckPending: 50000,
		})
		if err != nil {
			w.log.Warn("create READINGS consumer; retrying", "consumer", name, "err", err)
			sleep(ctx, time.Second)
			continue
		}
		ps.mu.Lock()
		ps.cons = cons
		ps.mu.Unlock()
		if err := w.consumeWith(ctx, cons, ps); err != nil && ctx.Err() == nil {
			w.log.Warn("READINGS consumer stopped; restarting it", "consumer", name, "err", err)
			sleep(ctx, time.Second)
		}
	}
	return nil
}

type pending struct {
	msg      jetstream.Msg
	fut      jetstream.PubAckFuture // nil: nothing to wait for
	put      *nats.Msg
	ttl      time.Duration
	storedNS int64
	seq      uint64
}

func (w *Watchdog) consumeWith(ctx context.Context, cons jetstream.Consumer, ps *partState) error {
	it, err := cons.Messages(jetstream.PullMaxMessages(2000))
	if err != nil {
		return fmt.Errorf("pull READINGS: %w", err)
	}
	defer it.Stop()
	acks := make(chan pending, 4096)
	ackDone := make(chan error, 1)
	go func() { ackDone <- w.acker(ctx, acks, ps) }()
	defer func() {
		close(acks)
		<-ackDone
	}()
	stopOnCancel := context.AfterFunc(ctx, it.Stop)
	defer stopOnCancel()
	for {
		msg, err := it.Next()
		if err != nil {
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) || ctx.Err() != nil {
				return ctx.Err()
			}
			if errors.Is(err, jetstream.ErrConsumerDeleted) || errors.Is(err, jetstream.ErrConsumerNotFound) {
				return fmt.Errorf("pull READINGS: %w", err) // recreated by consume
			}
			w.log.Debug("READINGS iterator", "err", err)
			continue
		}
		md, err := msg.Metadata()
		if err != nil {
			continue
		}
		pd := pending{msg: msg, storedNS: md.Timestamp.UnixNano(), seq: md.Sequence.Stream}
		l, err := event.CheckLog(msg.Subject(), msg.Data(), w.cfg.Partitions)
		switch {
		case err != nil:
			// Set aside before the acker can ack past it: a forged id would otherwise
			// refresh (or fail to refresh, forever) a key that is no sensor's.
			if err := w.setAside.SetAside(ctx, natsx.ReadingsStream, md.Sequence.Stream, msg.Subject(), msg.Data(), err); err != nil {
				return err
			}
		case l.Kind == event.KindReading && !w.needsRefresh(ps, l.SensorID, l.ReceivedTime):
			w.m.coalesced.Inc()
		case l.Kind == event.KindReading:
			pd.put, pd.ttl = w.refreshMsg(l.SensorID, l.ReceivedTime, md.Sequence.Stream, time.Now())
			pd.fut, err = w.js.PublishMsgAsync(pd.put, jetstream.WithMsgTTL(pd.ttl))
			if err != nil {
				pd.fut = nil // the acker publishes it synchronously, with retries
			}
		}
		select {
		case acks <- pd:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// acker waits for each refresh in order, then acks (AckAll) the newest message whose refresh
// and every earlier one is stored.
func (w *Watchdog) acker(ctx context.Context, in <-chan pending, ps *partState) error {
	var last jetstream.Msg
	n := 0
	flush := func() {
		if last != nil {
			_ = last.Ack()
			last = nil
		}
	}
	for pd := range in {
		if pd.put != nil {
			ok := false
			if pd.fut != nil {
				select {
				case <-pd.fut.Ok():
					ok = true
				case <-pd.fut.Err():
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			for attempt := 1; !ok; attempt++ {
				_, err := w.js.PublishMsg(ctx, &nats.Msg{Subject: pd.put.Subject, Data: pd.put.Data, Header: nats.Header{}}, jetstream.WithMsgTTL(pd.ttl))
				if err == nil {
					break
				}
				if ctx.Err() != nil {
					return ctx.Err()
				}
				// A NATS restart makes a few of these; more means the bucket is unusable.
				level := slog.LevelDebug
				if attempt%25 == 0 {
					level = slog.LevelWarn
				}
				w.log.Log(ctx, level, "refresh liveness key; retrying", "subject", pd.put.Subject, "attempt", attempt, "err", err)
				sleep(ctx, 200*time.Millisecond)
			}
			w.m.refreshes.Inc()
		}
		ps.doneTS.Store(pd.storedNS)
		ps.doneSeq.Store(pd.seq)
		last = pd.msg
		n++
		if n%512 == 0 || len(in) == 0 {
			flush()
		}
	}
	flush()
	return nil
}

// watch follows the bucket (headers only) for limit markers of owned sensors.
func (w *Watchdog) watch(ctx context.Context) error {
	for ctx.Err() == nil {
		oc, err := w.js.OrderedConsumer(ctx, kvStream, jetstream.OrderedConsumerConfig{
			FilterSubjects: w.kvFilters(),
			DeliverPolicy:  jetstream.DeliverLastPerSubjectPolicy,
			HeadersOnly:    true,
		})
		if err != nil {
			w.log.Warn("watch liveness bucket; retrying", "err", err)
			sleep(ctx, time.Second)
			continue
		}
		cc, err := oc.Consume(w.onKVMsg, jetstream.PullMaxMessages(4000))
		if err != nil {
			w.log.Warn("watch liveness bucket; retrying", "err", err)
			sleep(ctx, time.Second)
			continue
		}
		<-ctx.Done()
		cc.Drain()
		select {
		case <-cc.Closed():
		case <-time.After(5 * time.Second):
		}
	}
	return nil
}

func (w *Watchdog) onKVMsg(m jetstream.Msg) {
	sensor, ok := w.sensorOfSubject(m.Subject())
	if !ok {
		return
	}
	md, err := m.Metadata()
	if err != nil {
		return
	}
	h := m.Headers()
	if h.Get(jetstream.MarkerReasonHeader) == "" {
		// A value: whatever expiry we held for this key is superseded.
		w.mu.Lock()
		if c, ok := w.held[sensor]; ok && c.rev != 0 && c.rev < md.Sequence.Stream {
			delete(w.held, sensor)
		}
		w.mu.Unlock()
		return
	}
	w.m.expiries.Inc()
	w.addCandidate(sensor, candidate{rev: md.Sequence.Stream, expect: true, at: md.Timestamp})
}

// FactMsgID is the Nats-Msg-Id of the liveness_timeout fact that follows the reading at
// READINGS sequence seq: the same expiry appended twice is stored once.
func FactMsgID(sensor string, seq uint64) string {
	return "liveness:" + sensor + ":" + strconv.FormatUint(seq, 10)
}

// settle decides one expiry from the sensor's last message in READINGS.
func (w *Watchdog) settle(ctx context.Context, readings jetstream.Stream, sensor string, c candidate) error {
	p := partition.Of(sensor, w.cfg.Partitions)
	last, err := readings.GetLastMsgForSubject(ctx, "readings."+strconv.Itoa(p)+"."+sensor)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil // nothing was ever read from it: nothing to declare
	}
	if err != nil {
		return fmt.Errorf("last READINGS message of %s: %w", sensor, err)
	}
	l, err := event.CheckLog(last.Subject, last.Data, w.cfg.Partitions)
	if err != nil {
		// A forged or malformed last message (set aside by the consumers) must not hide the
		// sensor's silence for ever: it counts as nothing more than a message stored then.
		l = event.Log{Kind: event.KindReading, SensorID: sensor, ReceivedTime: last.Time}
	}
	expect := []jetstream.PublishOpt{}
	if c.expect {
		expect = append(expect, jetstream.WithExpectLastSequencePerSubject(c.rev))
	}
	if l.Kind == event.KindLivenessTimeout {
		w.m.alreadyDeclared.Inc()
		// Declared before (e.g. we stopped before marking the key): mark it now.
		return w.markDeclared(ctx, sensor, last, expect)
	}
	lostAfter := w.lostAfter(sensor)
	now := time.Now()
	if left := lostAfter - now.Sub(l.ReceivedTime); left > 0 {
		// A reading younger than lost_after: the key expired because we were behind.
		w.m.refreshedOnCheck.Inc()
		_, err := w.js.PublishMsg(ctx, &nats.Msg{Subject: w.kvSubject(sensor), Data: encodeValue(l.ReceivedTime, last.Sequence, false), Header: nats.Header{}},
			append(expect, jetstream.WithMsgTTL(ttlFor(left)))...)
		if isWrongLastSeq(err) {
			return nil // refreshed meanwhile
		}
		if err != nil {
			return fmt.Errorf("refresh %s: %w", sensor, err)
		}
		return nil
	}
	fact := event.Log{V: event.Version, Kind: event.KindLivenessTimeout, SensorID: sensor, ReceivedTime: now.UTC(), LostAfter: lostAfter}
	body, err := jsonFact(fact)
	if err != nil {
		return err
	}
	if _, err := w.js.PublishMsg(ctx, &nats.Msg{Subject: natsx.ReadingsSubject(sensor), Data: body, Header: nats.Header{}},
		jetstream.WithMsgID(FactMsgID(sensor, last.Sequence))); err != nil {
		return fmt.Errorf("append liveness_timeout of %s: %w", sensor, err)
	}
	w.m.facts.Inc()
	if c.overdue {
		w.m.declaredAtMaxHold.Inc()
		w.log.Warn("sensor declared lost despite the pipeline lag: its expiry was held for max_hold",
			"sensor", sensor, "held_for", now.Sub(c.heldSince).Round(time.Millisecond), "max_hold", w.cfg.MaxHold, "last_reading", l.ReceivedTime)
	}
	w.forget(sensor)
	w.m.delay.Observe(now.Sub(l.ReceivedTime.Add(lostAfter)).Seconds())
	if !c.at.IsZero() {
		w.m.markerLag.Observe(c.at.Sub(l.ReceivedTime.Add(lostAfter)).Seconds())
	}
	crashpoint.Hit("watchdog.after_fact")
	// Marking the key only spares a restart from settling this expiry again (which would
	// find the fact as the sensor's last message and append nothing): no need to wait.
	put := &nats.Msg{Subject: w.kvSubject(sensor), Data: encodeValue(l.ReceivedTime, last.Sequence, true), Header: nats.Header{}}
	if _, err := w.js.PublishMsgAsync(put, expect...); err != nil {
		return w.markDeclared(ctx, sensor, last, expect)
	}
	return nil
}

func (w *Watchdog) markDeclared(ctx context.Context, sensor string, last *jetstream.RawStreamMsg, expect []jetstream.PublishOpt) error {
	received := last.Time
	if l, err := event.DecodeLog(last.Data); err == nil && l.Kind == event.KindReading {
		received = l.ReceivedTime
	}
	_, err := w.js.PublishMsg(ctx, &nats.Msg{Subject: w.kvSubject(sensor), Data: encodeValue(received, last.Sequence, true), Header: nats.Header{}}, expect...)
	if err != nil && !isWrongLastSeq(err) {
		return fmt.Errorf("mark %s declared: %w", sensor, err)
	}
	return nil
}

func isWrongLastSeq(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

func jsonFact(l event.Log) ([]byte, error) {
	b, err := json.Marshal(l)
	if err != nil {
		return nil, fmt.Errorf("encode liveness_timeout: %w", err)
	}
	return b, nil
}
