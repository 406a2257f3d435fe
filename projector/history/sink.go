package history

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/lock-sensors/lock-sensors/internal/backoff"
	"github.com/lock-sensors/lock-sensors/internal/chschema"
	"github.com/lock-sensors/lock-sensors/internal/crashpoint"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
)

// sink buffers one table's rows and writes them.
type sink struct {
	h     *Projector
	table table
	in    chan item
	srcs  []*source
	// inflight is the stream time (unix ns) of the oldest message of the batch being written.
	inflight atomic.Int64
}

func (s *sink) sources(cfg Config) []*source {
	switch s.table.name {
	case "readings":
		var out []*source
		for _, p := range cfg.Partitions {
			out = append(out, &source{stream: natsx.ReadingsStream, durable: readingsConsumer(cfg.Durable, p),
				filter: natsx.ReadingsPartitionFilter(p), partitioned: true})
		}
		return out
	case "events":
		var out []*source
		for _, p := range cfg.Partitions {
			out = append(out, &source{stream: natsx.EventsStream, durable: cfg.Durable + "_events_" + strconv.Itoa(p),
				filter: natsx.EventsPartitionFilter(p), partitioned: true})
		}
		return out
	default:
		// DELIVERIES is not partitioned: every history process pulls from the one durable
		// consumer, and JetStream splits its messages between them.
		return []*source{{stream: natsx.DeliveriesStream, durable: cfg.Durable + "_deliveries"}}
	}
}

// readingsConsumer names the history projector's READINGS consumer of partition p,
// which the rebuild runner also reads its checkpoint and lag from.
func readingsConsumer(durable string, p int) string {
	return durable + "_readings_" + strconv.Itoa(p)
}

func (s *sink) pendingMessages() float64 {
	var n uint64
	for _, src := range s.srcs {
		n += src.numPending.Load()
	}
	return float64(n) + float64(len(s.in))
}

// run collects items until in is closed. A batch is handed to the writer when it is full or
// its oldest row is FlushInterval old; the next one is collected meanwhile, so pulling and
// decoding overlap the INSERT. At most one INSERT per table is in flight.
func (s *sink) run(ctx context.Context) error {
	cfg := s.h.cfg
	writeq := make(chan []item)
	written := make(chan struct{})
	go func() {
		defer close(written)
		for b := range writeq {
			s.flush(ctx, b)
		}
	}()
	defer func() { close(writeq); <-written }()

	var buf []item
	var due <-chan time.Time
	ready := false
	keepAlive := time.NewTicker(min(time.Second, cfg.AckWait/3))
	defer keepAlive.Stop()
	lastTouch := time.Now()
	src := s.in // nil once closed
	in := src
	for {
		var out chan<- []item
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
				touch(buf)
				lastTouch = time.Now()
			}
			s.setLag(buf)
		case <-ctx.Done():
			return nil
		}
	}
}

// setLag sets the lag from the oldest of the batch being written and buf.
func (s *sink) setLag(buf []item) {
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

// touch tells JetStream the messages are still being worked on.
func touch(b []item) {
	for _, it := range b {
		_ = it.msg.InProgress()
	}
}

// flush writes b in one INSERT, retrying with a growing delay until it succeeds or ctx ends,
// and only then acks. On ctx's end nothing is acked: the messages come back.
func (s *sink) flush(ctx context.Context, b []item) {
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
		retry := backoff.Policy{Min: cfg.BackoffMin, Max: cfg.BackoffMax}
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
				"table", s.table.name, "rows", len(rows), "attempt", attempt, "retry_in", retry.Next(attempt), "err", err)
			// Jittered, so that the tables' writers do not retry in step.
			delay := retry.Next(attempt)
			if !backoff.Sleep(ctx, delay/2+rand.N(delay/2+1)) {
				return
			}
			if v := s.inflight.Load(); v != 0 {
				s.h.m.lag.WithLabelValues(s.table.name).Set(time.Since(time.Unix(0, v)).Seconds())
			}
			if time.Since(lastTouch) >= cfg.AckWait/3 {
				touch(b)
				lastTouch = time.Now()
			}
		}
	}
	crashpoint.Hit(CrashAfterInsert)
	s.savePositions(ctx, b)
	crashpoint.Hit(CrashAfterPosition)
	for _, it := range b {
		if err := it.msg.Ack(); err != nil {
			// The row is written; a lost ack means a redelivery, which the table collapses.
			s.h.log.Debug("history: ack failed", "err", err)
		}
		it.src.done.Add(1)
	}
	s.h.m.rows.WithLabelValues(s.table.name).Add(float64(len(rows)))
	s.h.m.batches.WithLabelValues(s.table.name).Inc()
}

// savePositions writes, in one INSERT, where the sources of b resume now that b's rows are
// written: a partition's after its last message in b, DELIVERIES' after its consumer's ack
// floor (the batches before this one: this one is acked next). A failure leaves the positions
// behind, which costs only writing the tail again; the next batch writes them anew.
func (s *sink) savePositions(ctx context.Context, b []item) {
	ps := map[string]position{}
	for _, it := range b {
		if it.src.partitioned {
			if it.seq > 0 {
				ps[it.src.durable] = position{stream: it.stream, seq: it.seq}
			}
			continue
		}
		if _, ok := ps[it.src.durable]; ok {
			continue
		}
		ps[it.src.durable] = position{}
		if sc := it.src.shared.Load(); sc != nil {
			ictx, cancel := context.WithTimeout(ctx, natsx.RequestTimeout)
			info, err := sc.cons.Info(ictx)
			cancel()
			if err == nil {
				ps[it.src.durable] = position{stream: sc.stream, seq: info.AckFloor.Stream}
			}
		}
	}
	for src, p := range ps {
		if p.seq == 0 {
			delete(ps, src)
		}
	}
	if len(ps) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, s.h.cfg.InsertTimeout)
	defer cancel()
	if err := writePositions(ctx, s.h.ch, ps, time.Now()); err != nil {
		s.h.m.errors.WithLabelValues(chschema.Positions.Name).Inc()
		s.h.log.Warn("history: the rows are written, but not where their consumers resume; a restart writes them again",
			"table", s.table.name, "err", err)
	}
}

func (s *sink) insert(ctx context.Context, cols []any) error {
	ctx, cancel := context.WithTimeout(ctx, s.h.cfg.InsertTimeout)
	defer cancel()
	return insertRows(ctx, s.h.ch, s.table, cols)
}

// insertRows writes columns (as built by table.columns) in one INSERT naming every column.
func insertRows(ctx context.Context, ch driver.Conn, t table, cols []any) error {
	ctx, done := batchContext(ctx)
	defer done()
	b, err := ch.PrepareBatch(ctx, t.schema.Insert(t.name))
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
