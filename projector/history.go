package projector

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/lock-sensors/lock-sensors/internal/crashpoint"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/partition"
	"github.com/lock-sensors/lock-sensors/internal/setaside"
)

// HistoryCrashAfterInsert is the crash point between a batch's INSERT and the acks of its
// messages: a process killed there leaves rows in ClickHouse whose messages come back, which
// the ReplacingMergeTree tables and the collapsing queries must absorb.
const HistoryCrashAfterInsert = "history.after_insert"

// HistoryConfig configures the history projector. Zero fields take the defaults.
type HistoryConfig struct {
	// Partitions are the READINGS and EVENTS partitions this process writes.
	Partitions partition.Set
	// PartitionCount is LOCKS_PARTITIONS, against which message subjects are checked (0:
	// only the sensor of a subject is checked, not its partition number).
	PartitionCount int
	// BatchSize is the number of rows buffered per table before an INSERT (default 10,000).
	BatchSize int
	// FlushInterval is the age of the oldest buffered row at which the buffer is written even
	// if not full (default 1 s; up to minutes for a few large parts).
	FlushInterval time.Duration
	// AckWait is how long JetStream waits for an ack before redelivering (default 60 s, at
	// least 3 × FlushInterval). Buffered messages are kept alive with InProgress while an
	// INSERT waits or retries, so this only bounds how soon a crashed writer's messages return.
	AckWait time.Duration
	// MaxAckPending is the unacked messages per consumer (default 2 × BatchSize; never below BatchSize).
	MaxAckPending int
	// InsertTimeout bounds one INSERT attempt (default 30 s).
	InsertTimeout time.Duration
	// BackoffMin and BackoffMax bound the growing delay between failed INSERTs (200 ms, 10 s).
	BackoffMin, BackoffMax time.Duration
	// Durable prefixes the consumer names (default "history").
	Durable string
	// ShutdownGrace bounds the last flush after the context is cancelled (default 10 s).
	ShutdownGrace time.Duration
}

func (c *HistoryConfig) setDefaults() {
	if c.BatchSize == 0 {
		c.BatchSize = 10_000
	}
	if c.FlushInterval == 0 {
		c.FlushInterval = time.Second
	}
	if c.AckWait == 0 {
		c.AckWait = max(60*time.Second, 3*c.FlushInterval)
	}
	if c.MaxAckPending == 0 {
		c.MaxAckPending = 2 * c.BatchSize
	}
	if c.InsertTimeout == 0 {
		c.InsertTimeout = 30 * time.Second
	}
	if c.BackoffMin == 0 {
		c.BackoffMin = 200 * time.Millisecond
	}
	if c.BackoffMax == 0 {
		c.BackoffMax = 10 * time.Second
	}
	if c.Durable == "" {
		c.Durable = DefaultHistoryDurable
	}
	if c.ShutdownGrace == 0 {
		c.ShutdownGrace = 10 * time.Second
	}
}

// Validate reports the first unusable setting.
func (c HistoryConfig) Validate() error {
	switch {
	case len(c.Partitions) == 0:
		return errors.New("history: no partitions to write")
	case c.BatchSize < 1:
		return fmt.Errorf("history: batch size %d must be >= 1", c.BatchSize)
	case c.FlushInterval <= 0:
		return fmt.Errorf("history: flush interval %s must be positive", c.FlushInterval)
	case c.AckWait < time.Second:
		return fmt.Errorf("history: ack wait %s must be >= 1s", c.AckWait)
	case c.MaxAckPending < c.BatchSize:
		return fmt.Errorf("history: max ack pending %d must be >= batch size %d, or a batch never fills", c.MaxAckPending, c.BatchSize)
	case c.InsertTimeout <= 0 || c.BackoffMin <= 0 || c.BackoffMax < c.BackoffMin:
		return errors.New("history: insert timeout and backoff must be positive, BackoffMax >= BackoffMin")
	}
	for _, p := range c.Partitions {
		if p < 0 {
			return fmt.Errorf("history: partition %d < 0", p)
		}
	}
	return nil
}

// History is the history projector: it copies READINGS (readings only), EVENTS and
// DELIVERIES into ClickHouse in batches, acking each message only after the INSERT that
// holds its row succeeded.
type History struct {
	cfg   HistoryConfig
	js    jetstream.JetStream
	ch    driver.Conn
	log   *slog.Logger
	sinks []*historySink
	m     *historyMetrics
	ran   atomic.Bool
	// setAside records the READINGS and EVENTS messages that can never be rows.
	setAside *setaside.Recorder
}

// NewHistory builds the history projector; its metrics are registered on reg.
func NewHistory(cfg HistoryConfig, js jetstream.JetStream, ch driver.Conn, log *slog.Logger, reg prometheus.Registerer) (*History, error) {
	if js == nil || ch == nil || log == nil || reg == nil {
		return nil, errors.New("history: nil dependency")
	}
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	m, err := newHistoryMetrics(reg)
	if err != nil {
		return nil, err
	}
	h := &History{cfg: cfg, js: js, ch: ch, log: log.With("part", "history"), m: m}
	if h.setAside, err = setaside.NewRecorder(HistoryConsumer, js, h.log, reg); err != nil {
		return nil, err
	}
	for _, t := range historyTables {
		s := &historySink{h: h, table: t, in: make(chan historyItem, min(cfg.BatchSize, 4096))}
		m.buffered.WithLabelValues(t.name) // make the series visible from the start
		if err := reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "locks_history_pending_messages",
			Help:        "Messages of the table's streams not yet written to ClickHouse (in the stream and in the buffer).",
			ConstLabels: prometheus.Labels{"table": t.name},
		}, s.pendingMessages)); err != nil {
			return nil, fmt.Errorf("history: register metrics: %w", err)
		}
		h.sinks = append(h.sinks, s)
	}
	return h, nil
}

type historyMetrics struct {
	rows, batches, errors *prometheus.CounterVec
	skipped               *prometheus.CounterVec
	lag                   *prometheus.GaugeVec
	buffered              *prometheus.GaugeVec
	insertSeconds         *prometheus.HistogramVec
}

func newHistoryMetrics(reg prometheus.Registerer) (*historyMetrics, error) {
	m := &historyMetrics{
		rows: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "locks_history_rows_written_total", Help: "Rows written to ClickHouse by the history projector.",
		}, []string{"table"}),
		batches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "locks_history_batches_total", Help: "Successful INSERTs of the history projector.",
		}, []string{"table"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "locks_history_insert_errors_total", Help: "Failed INSERT attempts (each is retried).",
		}, []string{"table"}),
		skipped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "locks_history_skipped_total", Help: "Messages acked without a row: not a reading, undecodable, or set aside (forged or malformed).",
		}, []string{"table", "reason"}),
		lag: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "locks_history_lag_seconds",
			Help: "Age (by stream time) of the oldest message received but not yet written; 0 when none waits.",
		}, []string{"table"}),
		buffered: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "locks_history_buffered_rows", Help: "Rows buffered for the next INSERT.",
		}, []string{"table"}),
		insertSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "locks_history_insert_seconds", Help: "Duration of successful INSERTs.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 12),
		}, []string{"table"}),
	}
	for _, c := range []prometheus.Collector{m.rows, m.batches, m.errors, m.skipped, m.lag, m.buffered, m.insertSeconds} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("history: register metrics: %w", err)
		}
	}
	return m, nil
}

// historyItem is one message and the row it becomes (nil row: ack only).
type historyItem struct {
	msg   jetstream.Msg
	row   any
	stamp time.Time // stream time of the message, for the lag
}

// historySource is one durable consumer feeding a sink.
type historySource struct {
	stream, durable, filter string
	numPending              atomic.Uint64
}

// Run consumes until ctx is done, then writes and acks what it holds (within ShutdownGrace).
// It runs once per History.
func (h *History) Run(ctx context.Context) error {
	if h.ran.Swap(true) {
		return errors.New("history: Run called twice")
	}
	type job struct {
		sink *historySink
		src  *historySource
		cons jetstream.Consumer
	}
	var jobs []job
	for _, s := range h.sinks {
		for _, src := range s.sources(h.cfg) {
			cons, err := h.js.CreateOrUpdateConsumer(ctx, src.stream, jetstream.ConsumerConfig{
				Durable:       src.durable,
				Description:   "history projector: " + s.table.name + " to ClickHouse",
				FilterSubject: src.filter,
				DeliverPolicy: jetstream.DeliverAllPolicy,
				AckPolicy:     jetstream.AckExplicitPolicy,
				AckWait:       h.cfg.AckWait,
				MaxDeliver:    -1,
				MaxAckPending: h.cfg.MaxAckPending,
			})
			if err != nil {
				return fmt.Errorf("history: consumer %s on %s: %w", src.durable, src.stream, err)
			}
			s.srcs = append(s.srcs, src)
			jobs = append(jobs, job{s, src, cons})
		}
	}
	// Sinks outlive ctx by ShutdownGrace, so that what sources drain is still written.
	sinkCtx, cancelSinks := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelSinks()
	stop := context.AfterFunc(ctx, func() { time.AfterFunc(h.cfg.ShutdownGrace, cancelSinks) })
	defer stop()

	g, gctx := errgroup.WithContext(ctx)
	var sg errgroup.Group
	for _, s := range h.sinks {
		sg.Go(func() error { return s.run(sinkCtx) })
	}
	var wgs = map[*historySink]*sync.WaitGroup{}
	for _, s := range h.sinks {
		wgs[s] = &sync.WaitGroup{}
	}
	for _, j := range jobs {
		wg := wgs[j.sink]
		wg.Add(1)
		g.Go(func() error {
			defer wg.Done()
			return h.consume(gctx, sinkCtx, j.cons, j.src, j.sink)
		})
	}
	for _, s := range h.sinks {
		go func() { wgs[s].Wait(); close(s.in) }()
	}
	h.log.Info("history projector running", "partitions", fmt.Sprint(h.cfg.Partitions),
		"batch_size", h.cfg.BatchSize, "flush_interval", h.cfg.FlushInterval)
	err := g.Wait()
	if serr := sg.Wait(); err == nil {
		err = serr
	}
	if err != nil && ctx.Err() == nil {
		return err
	}
	h.log.Info("history projector stopped")
	return nil
}

// consume feeds one consumer's messages to its sink until ctx is done, then drains what the
// client already pulled so that those messages are written now rather than redelivered later.
func (h *History) consume(ctx, sinkCtx context.Context, cons jetstream.Consumer, src *historySource, s *historySink) error {
	it, err := cons.Messages(jetstream.PullMaxMessages(min(h.cfg.BatchSize, 2000)))
	if err != nil {
		return fmt.Errorf("history: consume %s: %w", src.durable, err)
	}
	stop := context.AfterFunc(ctx, it.Drain)
	defer stop()
	// A drain that cannot finish (NATS unreachable) is cut when the grace ends.
	stopHard := context.AfterFunc(sinkCtx, it.Stop)
	defer stopHard()
	defer it.Stop()
	for {
		msg, err := it.Next()
		switch {
		case errors.Is(err, jetstream.ErrMsgIteratorClosed):
			return nil
		case errors.Is(err, jetstream.ErrConsumerDeleted), errors.Is(err, jetstream.ErrConsumerNotFound):
			return fmt.Errorf("history: consumer %s: %w", src.durable, err)
		case err != nil:
			h.log.Warn("history: pulling messages", "consumer", src.durable, "err", err)
			continue
		}
		it := historyItem{msg: msg}
		if md, err := msg.Metadata(); err == nil {
			it.stamp = md.Timestamp
			src.numPending.Store(md.NumPending)
			refused, cerr := h.checkMsg(sinkCtx, src.stream, msg, md)
			if cerr != nil {
				return nil // stopping: the message is redelivered and checked again
			}
			if refused {
				err = errNotARow // set aside: acked with no row
				h.m.skipped.WithLabelValues(s.table.name, "set_aside").Inc()
			} else {
				it.row, err = s.table.decode(msg.Data(), md)
			}
			if err != nil && !refused {
				reason := "undecodable"
				if errors.Is(err, errNotARow) {
					reason = "not_a_row"
				} else {
					h.log.Error("history: skipping a message that cannot be decoded", "consumer", src.durable,
						"seq", md.Sequence.Stream, "err", err)
				}
				h.m.skipped.WithLabelValues(s.table.name, reason).Inc()
			}
		}
		select {
		case s.in <- it:
		case <-sinkCtx.Done():
			return nil
		}
	}
}

// historySink buffers one table's rows and writes them.
type historySink struct {
	h     *History
	table historyTable
	in    chan historyItem
	srcs  []*historySource
	// inflight is the stream time (unix ns) of the oldest message of the batch being written.
	inflight atomic.Int64
}

func (s *historySink) sources(cfg HistoryConfig) []*historySource {
	switch s.table.name {
	case "readings":
		var out []*historySource
		for _, p := range cfg.Partitions {
			out = append(out, &historySource{stream: natsx.ReadingsStream, durable: historyReadingsConsumer(cfg.Durable, p),
				filter: natsx.ReadingsPartitionFilter(p)})
		}
		return out
	case "events":
		var out []*historySource
		for _, p := range cfg.Partitions {
			out = append(out, &historySource{stream: natsx.EventsStream, durable: cfg.Durable + "_events_" + strconv.Itoa(p),
				filter: natsx.EventsPartitionFilter(p)})
		}
		return out
	default:
		// DELIVERIES is not partitioned: every history process pulls from the one durable
		// consumer, and JetStream splits its messages between them.
		return []*historySource{{stream: natsx.DeliveriesStream, durable: cfg.Durable + "_deliveries"}}
	}
}

// DefaultHistoryDurable prefixes the history projector's consumer names by default.
const DefaultHistoryDurable = "history"

// historyReadingsConsumer names the history projector's READINGS consumer of partition p,
// which the rebuild runner also reads its checkpoint and lag from.
func historyReadingsConsumer(durable string, p int) string {
	return durable + "_readings_" + strconv.Itoa(p)
}

func (s *historySink) pendingMessages() float64 {
	var n uint64
	for _, src := range s.srcs {
		n += src.numPending.Load()
	}
	return float64(n) + float64(len(s.in))
}

// run collects items until in is closed. A batch is handed to the writer when it is full or
// its oldest row is FlushInterval old; the next one is collected meanwhile, so pulling and
// decoding overlap the INSERT. At most one INSERT per table is in flight.
func (s *historySink) run(ctx context.Context) error {
	cfg := s.h.cfg
	writeq := make(chan []historyItem)
	written := make(chan struct{})
	go func() {
		defer close(written)
		for b := range writeq {
			s.flush(ctx, b)
		}
	}()
	defer func() { close(writeq); <-written }()

	var buf []historyItem
	var due <-chan time.Time
	ready := false
	keepAlive := time.NewTicker(min(time.Second, cfg.AckWait/3))
	defer keepAlive.Stop()
	lastTouch := time.Now()
	src := s.in // nil once closed
	in := src
	for {
		var out chan<- []historyItem
		if ready {
			out = writeq
		}
		if len(buf) >= cfg.BatchSize {
			in = nil // full: wait for the writer
		} else {
			in = src
		}
		select {
		case it, ok := <-in:
			if !ok {
				src, in = nil, nil
				if len(buf) == 0 {
					return nil
				}
				ready = true
				continue
			}
			if len(buf) == 0 {
				due = time.After(cfg.FlushInterval)
				lastTouch = time.Now()
			}
			buf = append(buf, it)
			ready = ready || len(buf) >= cfg.BatchSize
		case <-due:
			due, ready = nil, true
		case out <- buf:
			buf, due, ready = nil, nil, false
			if src == nil {
				return nil
			}
		case <-keepAlive.C:
			// Long flush intervals or a busy writer: keep buffered messages from redelivery.
			if len(buf) > 0 && time.Since(lastTouch) >= cfg.AckWait/3 {
				historyTouch(buf)
				lastTouch = time.Now()
			}
			s.setLag(buf)
		case <-ctx.Done():
			return nil
		}
	}
}

// setLag sets the lag from the oldest of the batch being written and buf.
func (s *historySink) setLag(buf []historyItem) {
	var oldest time.Time
	if v := s.inflight.Load(); v != 0 {
		oldest = time.Unix(0, v)
	}
	if len(buf) > 0 && !buf[0].stamp.IsZero() && (oldest.IsZero() || buf[0].stamp.Before(oldest)) {
		oldest = buf[0].stamp
	}
	var lag float64
	if !oldest.IsZero() {
		lag = time.Since(oldest).Seconds()
	}
	s.h.m.lag.WithLabelValues(s.table.name).Set(lag)
	s.h.m.buffered.WithLabelValues(s.table.name).Set(float64(len(buf)))
}

// historyTouch tells JetStream the messages are still being worked on.
func historyTouch(b []historyItem) {
	for _, it := range b {
		_ = it.msg.InProgress()
	}
}

// flush writes b in one INSERT, retrying with a growing delay until it succeeds or ctx ends,
// and only then acks. On ctx's end nothing is acked: the messages come back.
func (s *historySink) flush(ctx context.Context, b []historyItem) {
	cfg := s.h.cfg
	if len(b) > 0 && !b[0].stamp.IsZero() {
		s.inflight.Store(b[0].stamp.UnixNano())
	}
	defer s.inflight.Store(0)
	rows := make([]any, 0, len(b))
	for _, it := range b {
		if it.row != nil {
			rows = append(rows, it.row)
		}
	}
	if len(rows) > 0 {
		cols := s.table.columns(rows)
		delay := cfg.BackoffMin
		lastTouch := time.Now()
		for attempt := 1; ; attempt++ {
			start := time.Now()
			err := s.insert(ctx, cols)
			if err == nil {
				s.h.m.insertSeconds.WithLabelValues(s.table.name).Observe(time.Since(start).Seconds())
				if attempt > 1 {
					s.h.log.Info("history: ClickHouse insert succeeded again", "table", s.table.name, "attempts", attempt, "rows", len(rows))
				}
				break
			}
			s.h.m.errors.WithLabelValues(s.table.name).Inc()
			if ctx.Err() != nil {
				s.h.log.Warn("history: stopping with rows not written; their messages will be redelivered",
					"table", s.table.name, "rows", len(rows), "err", err)
				return
			}
			lvl := slog.LevelWarn
			if attempt > 5 {
				lvl = slog.LevelError
			}
			s.h.log.Log(ctx, lvl, "history: ClickHouse insert failed; holding the batch and retrying",
				"table", s.table.name, "rows", len(rows), "attempt", attempt, "retry_in", delay, "err", err)
			t := time.NewTimer(delay/2 + rand.N(delay/2+1))
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			delay = min(2*delay, cfg.BackoffMax)
			if v := s.inflight.Load(); v != 0 {
				s.h.m.lag.WithLabelValues(s.table.name).Set(time.Since(time.Unix(0, v)).Seconds())
			}
			if time.Since(lastTouch) >= cfg.AckWait/3 {
				historyTouch(b)
				lastTouch = time.Now()
			}
		}
	}
	crashpoint.Hit(HistoryCrashAfterInsert)
	for _, it := range b {
		if err := it.msg.Ack(); err != nil {
			// The row is written; a lost ack means a redelivery, which the table collapses.
			s.h.log.Debug("history: ack failed", "err", err)
		}
	}
	s.h.m.rows.WithLabelValues(s.table.name).Add(float64(len(rows)))
	s.h.m.batches.WithLabelValues(s.table.name).Inc()
}

func (s *historySink) insert(ctx context.Context, cols []any) error {
	ctx, cancel := context.WithTimeout(ctx, s.h.cfg.InsertTimeout)
	defer cancel()
	return historyInsert(ctx, s.h.ch, s.table, cols)
}

// historyInsert writes columns (as built by table.columns) in one INSERT naming every column.
func historyInsert(ctx context.Context, ch driver.Conn, t historyTable, cols []any) error {
	b, err := ch.PrepareBatch(ctx, t.insert)
	if err != nil {
		return fmt.Errorf("prepare insert into %s: %w", t.name, err)
	}
	for i, c := range cols {
		if err := b.Column(i).Append(c); err != nil {
			_ = b.Abort()
			return fmt.Errorf("insert into %s: column %d: %w", t.name, i, err)
		}
	}
	if err := b.Send(); err != nil {
		return fmt.Errorf("insert into %s: %w", t.name, err)
	}
	return nil
}
