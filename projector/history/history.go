// Package history is the history projector: READINGS (readings), EVENTS and DELIVERIES copied
// into ClickHouse in batches, and the rebuild of those tables.
package history

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/lock-sensors/lock-sensors/internal/backoff"
	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/logread"
	"github.com/lock-sensors/lock-sensors/internal/part"
	"github.com/lock-sensors/lock-sensors/internal/setaside"
)

// Projector is the history projector: it copies READINGS (readings only), EVENTS and
// DELIVERIES into ClickHouse in batches, acking each message only after the INSERT that
// holds its row succeeded.
type Projector struct {
	cfg   Config
	js    jetstream.JetStream
	ch    driver.Conn
	log   *slog.Logger
	sinks []*sink
	m     *metrics
	gaps  *logread.Gaps
	ran   atomic.Bool
	// setAside records the READINGS and EVENTS messages that can never be rows.
	setAside *setaside.Recorder
}

// New builds the history projector; its metrics are registered on reg.
func New(cfg Config, d Deps) (*Projector, error) {
	if err := part.Require("history", part.Dep{Name: "Logger", Value: d.Logger}, part.Dep{Name: "Registerer", Value: d.Registerer},
		part.Dep{Name: "JS", Value: d.JS}, part.Dep{Name: "CH", Value: d.CH}); err != nil {
		return nil, err
	}
	js, ch, log, reg := d.JS, d.CH, d.Logger, d.Registerer
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	h := &Projector{cfg: cfg, js: js, ch: ch, log: log.With("part", "history"), m: m}
	if h.gaps, err = logread.NewGaps(reg, h.log, Name); err != nil {
		return nil, err
	}
	if h.setAside, err = setaside.NewRecorder(Name, js, h.log, reg); err != nil {
		return nil, err
	}
	for _, t := range tables {
		s := &sink{h: h, table: t, in: make(chan item, min(cfg.BatchSize, 4096))}
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

// item is one message and the row it becomes (nil row: ack only).
type item struct {
	msg   jetstream.Msg
	src   *source // where msg came from
	row   any
	stamp time.Time // stream time of the message, for the lag
	// seq is the message's stream sequence (0: unknown), and stream the identity of its
	// stream (a partition's): once the row is written, the source's position.
	seq    uint64
	stream string
}

// source is one durable consumer feeding a sink.
type source struct {
	stream, durable, filter string
	// partitioned: one partition of READINGS or EVENTS, read in order by this process
	// alone; otherwise the shared DELIVERIES consumer.
	partitioned bool
	numPending  atomic.Uint64
	// handed and done count the messages given to the sink and those it has acked.
	handed, done atomic.Uint64
	// pos is where the source resumes: read from ClickHouse at start, then (a partition's)
	// the last message handed to the sink. Only the source's consumer goroutine uses it.
	pos position
	// shared is the DELIVERIES consumer as last opened, for the sink's position of it.
	shared atomic.Pointer[sharedConsumer]
}

// Run consumes until ctx is done, then writes and acks what it holds (within ShutdownGrace).
// It runs once per History.
func (h *Projector) Run(ctx context.Context) error {
	if h.ran.Swap(true) {
		return errors.New("history: Run called twice")
	}
	type job struct {
		sink *sink
		src  *source
	}
	var jobs []job
	var srcs []*source
	for _, s := range h.sinks {
		for _, src := range s.sources(h.cfg) {
			s.srcs = append(s.srcs, src)
			srcs = append(srcs, src)
			jobs = append(jobs, job{s, src})
		}
	}
	if !h.loadPositions(ctx, srcs) {
		return nil
	}
	// Sinks outlive ctx by ShutdownGrace, so that what sources drain is still written.
	sinkCtx, cancelSinks := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelSinks()
	stop := context.AfterFunc(ctx, func() { time.AfterFunc(h.cfg.ShutdownGrace, cancelSinks) })
	defer stop()

	g, gctx := errgroup.WithContext(ctx)
	var sg errgroup.Group
	if h.cfg.Retention > 0 {
		g.Go(func() error { h.retain(gctx); return nil })
	}
	for _, s := range h.sinks {
		sg.Go(func() error { return s.run(sinkCtx) })
	}
	var wgs = map[*sink]*sync.WaitGroup{}
	for _, s := range h.sinks {
		wgs[s] = &sync.WaitGroup{}
	}
	for _, j := range jobs {
		wg := wgs[j.sink]
		wg.Add(1)
		g.Go(func() error {
			defer wg.Done()
			if j.src.partitioned {
				return h.consumePartition(gctx, sinkCtx, j.src, j.sink)
			}
			return h.consume(gctx, sinkCtx, j.src, j.sink)
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

// consumerConfig is the durable consumer of src, which feeds s. It is kept in memory: where
// it resumes is in ClickHouse (positions.go).
func (h *Projector) consumerConfig(s *sink, src *source) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:       src.durable,
		Description:   "history projector: " + s.table.name + " to ClickHouse",
		FilterSubject: src.filter,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       h.cfg.AckWait,
		MaxDeliver:    -1,
		MaxAckPending: h.cfg.MaxAckPending,
		MemoryStorage: true,
	}
}

// consumePartition feeds one partition's messages to its sink as contiguous runs (logread)
// until ctx is done. Its consumer, in memory, starts after the position read from ClickHouse;
// when a run breaks (or NATS restarted and the consumer is gone), it is recreated only once
// the sink has written and acked everything it was handed, right after the last of it.
func (h *Projector) consumePartition(ctx, sinkCtx context.Context, src *source, s *sink) error {
	cfg := h.consumerConfig(s, src)
	spec := logread.Spec{
		Stream: src.stream, Filter: src.filter, Durable: src.durable, Description: cfg.Description,
		AckPolicy: cfg.AckPolicy, AckWait: cfg.AckWait, MaxAckPending: cfg.MaxAckPending,
		MemoryStorage: true,
		Resume:        h.resume(src, s.table.name),
		OnGap:         h.gaps.OnGap(src.durable),
	}
	retry := backoff.New(100*time.Millisecond, time.Second)
	var r *logread.Reader
	for ctx.Err() == nil {
		var msgs []jetstream.Msg
		var err error
		if r == nil {
			r, err = logread.Open(ctx, h.js, spec)
		}
		if err == nil {
			msgs, err = r.Fetch(ctx, min(h.cfg.BatchSize, 2000), idleWait)
		}
		if err != nil {
			if ctx.Err() == nil {
				h.log.Warn("history: reading messages; retrying", "consumer", src.durable, "err", err)
				retry.Wait(ctx)
			}
			continue
		}
		retry.Reset()
		for _, msg := range msgs {
			it, ok := h.decode(sinkCtx, msg, src, s)
			if !ok {
				return nil
			}
			src.handed.Add(1)
			if it.seq > 0 {
				src.pos.seq = it.seq
			}
			select {
			case s.in <- it:
			case <-sinkCtx.Done():
				return nil
			}
		}
	}
	return nil
}

// resume is the Spec.Resume of a partition's source: once the sink has written all it was
// handed, right after src.pos (the position read at start, then the last message handed),
// checked against the stream as it is now.
func (h *Projector) resume(src *source, table string) func(context.Context) (uint64, error) {
	drained := logread.AfterDrained(&src.handed, &src.done)
	return func(ctx context.Context) (uint64, error) {
		if _, err := drained(ctx); err != nil {
			return 0, err
		}
		st, err := streamNow(ctx, h.js, src.stream)
		if err != nil {
			return 0, err
		}
		if src.pos.seq == 0 && (src.pos.stream == "" || src.pos.stream == st.ID) {
			// No position yet: where the Reader opened last, or at first the durable's ack
			// floor (a file-backed consumer of a version that kept no positions), or the
			// stream's start.
			src.pos.stream = st.ID
			return 0, nil
		}
		start := h.startFrom(ctx, src, table, src.pos, st)
		src.pos = position{stream: st.ID, seq: start - 1}
		return start, nil
	}
}

// idleWait is how long a read of an idle partition waits for a message; a delivery lost at
// the tail is noticed after it.
const idleWait = time.Second

// decode makes msg of src the item s writes: its row, or none for what is set aside or not a
// row. False: the set-aside record could not be written before the stop (msg is not acked and
// comes back).
func (h *Projector) decode(sinkCtx context.Context, msg jetstream.Msg, src *source, s *sink) (item, bool) {
	it := item{msg: msg, src: src, stream: src.pos.stream}
	if md, err := msg.Metadata(); err == nil {
		it.stamp, it.seq = md.Timestamp, md.Sequence.Stream
		src.numPending.Store(md.NumPending)
		it.row, err = s.table.decode(msg.Subject(), msg.Data(), md, h.cfg.PartitionCount)
		refused := errors.Is(err, event.ErrInvalid)
		if refused {
			// Set aside before the sink acks it with no row; when the record cannot be
			// written before the stop, the message is not acked and comes back.
			if serr := h.setAside.SetAside(sinkCtx, src.stream, md.Sequence.Stream, msg.Subject(), msg.Data(), err); serr != nil {
				return it, false
			}
			err = errNotARow
			h.m.skipped.WithLabelValues(s.table.name, "set_aside").Inc()
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
	return it, true
}
