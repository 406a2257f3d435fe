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

	"github.com/lock-sensors/lock-sensors/internal/event"
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
	row   any
	stamp time.Time // stream time of the message, for the lag
}

// source is one durable consumer feeding a sink.
type source struct {
	stream, durable, filter string
	numPending              atomic.Uint64
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
func (h *Projector) consume(ctx, sinkCtx context.Context, cons jetstream.Consumer, src *source, s *sink) error {
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
		it := item{msg: msg}
		if md, err := msg.Metadata(); err == nil {
			it.stamp = md.Timestamp
			src.numPending.Store(md.NumPending)
			it.row, err = s.table.decode(msg.Subject(), msg.Data(), md, h.cfg.PartitionCount)
			refused := errors.Is(err, event.ErrInvalid)
			if refused {
				// Set aside before the sink acks it with no row; when the record cannot be
				// written before the stop, the message is not acked and comes back.
				if serr := h.setAside.SetAside(sinkCtx, src.stream, md.Sequence.Stream, msg.Subject(), msg.Data(), err); serr != nil {
					return nil
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
		select {
		case s.in <- it:
		case <-sinkCtx.Done():
			return nil
		}
	}
}
