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

// sharedConsumer is the shared DELIVERIES consumer and the identity of its stream.
type sharedConsumer struct {
	cons   jetstream.Consumer
	stream string
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

// loadPositions reads where srcs resume from ClickHouse, trying again until it can or ctx is
// done (false).
func (h *Projector) loadPositions(ctx context.Context, srcs []*source) bool {
	names := make([]string, len(srcs))
	for i, src := range srcs {
		names[i] = src.durable
	}
	retry := backoff.New(100*time.Millisecond, 5*time.Second)
	for {
		ps, err := readPositions(ctx, h.ch, names)
		if err == nil {
			for _, src := range srcs {
				src.pos = ps[src.durable]
			}
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		h.log.Warn("history: reading where the consumers resume; retrying", "err", err)
		retry.Wait(ctx)
	}
}

// startFrom is where src, at p, reads next in st; a start elsewhere than right after p is
// logged and counted.
func (h *Projector) startFrom(ctx context.Context, src *source, table string, p position, st streamAt) uint64 {
	start, why := startAt(p, st)
	if why != "" {
		lvl := slog.LevelError
		if why == resetTruncated {
			lvl = slog.LevelWarn
		}
		h.log.Log(ctx, lvl, "history: a consumer does not resume at its position", "consumer", src.durable,
			"reason", explainReset(why, p, st, start))
		h.m.resets.WithLabelValues(table, why).Inc()
	}
	return start
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
		if src.pos.seq == 0 && (src.pos.stream == "" || src.pos.stream == st.id) {
			// No position yet: where the Reader opened last, or at first the durable's ack
			// floor (a file-backed consumer of a version that kept no positions), or the
			// stream's start.
			src.pos.stream = st.id
			return 0, nil
		}
		start := h.startFrom(ctx, src, table, src.pos, st)
		src.pos = position{stream: st.id, seq: start - 1}
		return start, nil
	}
}

// idleWait is how long a read of an idle partition waits for a message; a delivery lost at
// the tail is noticed after it.
const idleWait = time.Second

// consume feeds the shared DELIVERIES consumer's messages to its sink until ctx is done,
// opening the consumer again whenever it is gone (NATS restarted: it lived in memory).
func (h *Projector) consume(ctx, sinkCtx context.Context, src *source, s *sink) error {
	retry := backoff.New(100*time.Millisecond, 5*time.Second)
	for ctx.Err() == nil {
		cons, err := h.openShared(ctx, s, src)
		if err == nil {
			began := time.Now()
			if err = h.consumeShared(ctx, sinkCtx, cons, src, s); err == nil {
				return nil
			}
			if time.Since(began) > time.Minute {
				retry.Reset() // read well for a while: the waits start short again
			}
		}
		if ctx.Err() == nil {
			h.log.Warn("history: reading DELIVERIES; opening its consumer again", "consumer", src.durable, "err", err)
			retry.Wait(ctx)
		}
	}
	return nil
}

// openShared returns the DELIVERIES consumer that every history process shares, creating it
// when none is there (the first process, or NATS restarted and the memory consumer is gone)
// after the position in ClickHouse: the ack floor some process wrote after the rows, so
// never past a message not written. A file-backed consumer left by an earlier version is
// replaced by a memory one at its ack floor.
func (h *Projector) openShared(ctx context.Context, s *sink, src *source) (jetstream.Consumer, error) {
	st, err := streamNow(ctx, h.js, src.stream)
	if err != nil {
		return nil, err
	}
	cfg := h.consumerConfig(s, src)
	var p position
	cons, err := h.js.Consumer(ctx, src.stream, src.durable)
	switch {
	case err == nil && cons.CachedInfo().Config.MemoryStorage:
		if c := cons.CachedInfo().Config; c.AckWait != cfg.AckWait || c.MaxAckPending != cfg.MaxAckPending {
			c.AckWait, c.MaxAckPending = cfg.AckWait, cfg.MaxAckPending
			if cons, err = h.js.UpdateConsumer(ctx, src.stream, c); err != nil {
				return nil, fmt.Errorf("update consumer %s: %w", src.durable, err)
			}
		}
		src.shared.Store(&sharedConsumer{cons: cons, stream: st.id})
		return cons, nil
	case err == nil:
		p = position{stream: st.id, seq: cons.CachedInfo().AckFloor.Stream}
		if err := h.js.DeleteConsumer(ctx, src.stream, src.durable); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return nil, fmt.Errorf("replace the file-backed consumer %s: %w", src.durable, err)
		}
		h.log.Info("history: the file-backed DELIVERIES consumer is replaced by a memory one at its ack floor",
			"consumer", src.durable, "ack_floor", p.seq)
	case errors.Is(err, jetstream.ErrConsumerNotFound):
		ps, err := readPositions(ctx, h.ch, []string{src.durable})
		if err != nil {
			return nil, err
		}
		p = ps[src.durable]
	default:
		return nil, fmt.Errorf("consumer %s: %w", src.durable, err)
	}
	cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, h.startFrom(ctx, src, s.table.name, p, st)
	cons, err = h.js.CreateConsumer(ctx, src.stream, cfg)
	if errors.Is(err, jetstream.ErrConsumerExists) {
		// Another history process made it meanwhile, from a position as safe as this one.
		cons, err = h.js.Consumer(ctx, src.stream, src.durable)
	}
	if err != nil {
		return nil, fmt.Errorf("create consumer %s: %w", src.durable, err)
	}
	src.shared.Store(&sharedConsumer{cons: cons, stream: st.id})
	return cons, nil
}

// sharedHeartbeat is how often the server says an idle pull of DELIVERIES is alive; two
// missed mean the consumer is gone (NATS restarted) or unreachable, and it is opened again.
const sharedHeartbeat = 2 * time.Second

// consumeShared feeds cons's messages to the sink until ctx is done, then drains what the
// client already pulled so that those messages are written now rather than redelivered
// later: nil. Its messages are split between the history processes, so its consumer
// sequence has gaps by design: a lost one comes again after AckWait. An error: the consumer
// is gone or silent, to be opened again.
func (h *Projector) consumeShared(ctx, sinkCtx context.Context, cons jetstream.Consumer, src *source, s *sink) error {
	it, err := cons.Messages(jetstream.PullMaxMessages(min(h.cfg.BatchSize, 2000)),
		jetstream.PullHeartbeat(sharedHeartbeat), jetstream.WithMessagesErrOnMissingHeartbeat(true))
	if err != nil {
		return fmt.Errorf("consume %s: %w", src.durable, err)
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
		case errors.Is(err, jetstream.ErrMsgIteratorClosed) && ctx.Err() != nil:
			return nil
		case errors.Is(err, jetstream.ErrMsgIteratorClosed), errors.Is(err, jetstream.ErrNoHeartbeat),
			errors.Is(err, jetstream.ErrConsumerDeleted), errors.Is(err, jetstream.ErrConsumerNotFound):
			return fmt.Errorf("consumer %s: %w", src.durable, err)
		case err != nil:
			h.log.Warn("history: pulling messages", "consumer", src.durable, "err", err)
			continue
		}
		it, ok := h.decode(sinkCtx, msg, src, s)
		if !ok {
			return nil
		}
		select {
		case s.in <- it:
		case <-sinkCtx.Done():
			return nil
		}
	}
}

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
