// Package outbox relays the rows of an outbox table to JetStream: what a transaction decided
// to publish leaves through a row written in that transaction, and the relay publishes the
// rows in id order with their Nats-Msg-Id, awaits JetStream's acknowledgements and deletes
// only what was acknowledged. A crash between publish and delete publishes a row again, and
// JetStream's de-duplication (or Config.Check, past its window) keeps it from being doubled.
//
// A user provides the Table (how to read, scan and delete its rows) and a Row per row: the
// subject, the message id and, to keep a key's rows in order, a Key. Rows of one Key are
// never in flight together: a round is sent in waves of at most one row per key, each wave
// acknowledged in full before the next, and a failed wave ends the round, so a later row of
// a key never overtakes an earlier one in the stream.
package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/lock-sensors/lock-sensors/internal/backoff"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/part"
)

// Row is one outbox row to publish.
type Row struct {
	// ID is the row's id in its table: rows are published in this order.
	ID      int64
	Subject string
	// MsgID is the Nats-Msg-Id, by which JetStream drops a republished row.
	MsgID string
	Data  []byte
	// Key, when not empty, orders rows: one key's rows are never in flight together.
	Key string
	// Seq is the user's own number of the row within its Key (a revision), for Check.
	Seq int64
	// Created is when the row was written, for the user's Published hook.
	Created time.Time
	// Traceparent, when set, is sent as the message's W3C traceparent header.
	Traceparent string
}

// ErrNotAcked says JetStream did not acknowledge a round's publishes within AckTimeout.
var ErrNotAcked = errors.New("outbox: publishes not acknowledged in time")

// Relay publishes one outbox table's rows. Run it once; Wake it after writing rows.
type Relay struct {
	cfg  Config
	js   jetstream.JetStream
	pg   *pgxpool.Pool
	log  *slog.Logger
	wake chan struct{}
	// tracer is nil without tracing (trace.go).
	tracer trace.Tracer

	relayed  prometheus.Counter
	dropped  prometheus.Counter
	failures prometheus.Counter
	// batches and batchFailures count atomic batches sent and refused (publishBatches).
	batches, batchFailures prometheus.Counter
	// allowsAtomic caches whether the rows' stream takes atomic batches (atomic).
	allowsAtomic atomic.Pointer[bool]
}

// New builds a relay.
func New(cfg Config, d Deps) (*Relay, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := part.Require("outbox "+cfg.Name, part.Dep{Name: "Logger", Value: d.Logger},
		part.Dep{Name: "Registerer", Value: d.Registerer}, part.Dep{Name: "JS", Value: d.JS},
		part.Dep{Name: "PG", Value: d.PG}); err != nil {
		return nil, err
	}
	// A JetStream context of its own, so that an ack that never comes fails its future
	// (and frees its slot) instead of staying pending on the shared connection.
	js, err := jetstream.New(d.JS.Conn(), jetstream.WithPublishAsyncTimeout(cfg.AckTimeout),
		jetstream.WithPublishAsyncMaxPending(max(cfg.Batch, 256)))
	if err != nil {
		return nil, fmt.Errorf("outbox %s: JetStream context: %w", cfg.Name, err)
	}
	r := &Relay{cfg: cfg, js: js, pg: d.PG, log: d.Logger.With("outbox", cfg.Name), wake: make(chan struct{}, 1), tracer: d.Tracer,
		relayed: prometheus.NewCounter(prometheus.CounterOpts{Name: "locks_outbox_relayed_total",
			Help: "Outbox rows published to JetStream and deleted."}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{Name: "locks_outbox_dropped_total",
			Help: "Outbox rows found already published after a failure, deleted without publishing."}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{Name: "locks_outbox_round_errors_total",
			Help: "Relay rounds that failed and will be retried."}),
		batches: prometheus.NewCounter(prometheus.CounterOpts{Name: "locks_outbox_batches_total",
			Help: "Atomic batches of rows published (when the stream allows them)."}),
		batchFailures: prometheus.NewCounter(prometheus.CounterOpts{Name: "locks_outbox_batch_failures_total",
			Help: "Atomic batches refused or unanswered; their rows were published one by one."}),
	}
	if err := part.Register(d.Registerer, "outbox "+cfg.Name, r.relayed, r.dropped, r.failures, r.batches, r.batchFailures); err != nil {
		return nil, err
	}
	return r, nil
}

// Wake makes the relay start a round soon (after Linger); it never blocks.
func (r *Relay) Wake() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Run relays until ctx is done, then makes one last round within DrainTimeout (if set).
func (r *Relay) Run(ctx context.Context) error {
	b := backoff.New(r.cfg.Backoff.Min, r.cfg.Backoff.Max)
	// Until a round has gone through cleanly, rows may be left over from a crash or a
	// failed publish: Check sees them first.
	suspect := true
	poll := time.NewTimer(r.cfg.Poll)
	defer poll.Stop()
	for ctx.Err() == nil {
		n, err := r.Round(ctx, suspect)
		suspect = err != nil
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			r.failures.Inc()
			r.log.Warn("relay outbox rows; retrying", "err", err, "fails", b.Fails()+1)
			b.Wait(ctx)
			continue
		}
		b.Reset()
		if n >= r.cfg.Batch {
			continue // more is waiting
		}
		poll.Reset(r.cfg.Poll)
		select {
		case <-r.wake:
			backoff.Sleep(ctx, r.cfg.Linger)
		case <-poll.C:
		case <-ctx.Done():
		}
	}
	if r.cfg.DrainTimeout > 0 {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.DrainTimeout)
		defer cancel()
		for {
			n, err := r.Round(dctx, suspect)
			if err != nil {
				r.log.Warn("last relay round at stop; the rows stay for the next run", "err", err)
				break
			}
			if n < r.cfg.Batch {
				break
			}
		}
	}
	return nil
}

// querier is a pool or a transaction.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// deleteRelayed deletes the rows of ids (relayed, or found already in the stream) without
// waiting for the commit's WAL flush: a delete that a crash of Postgres loses only leaves
// its rows to be published again, which JetStream's de-duplication (or Check, past its
// window) drops. In a transaction, the rest of it commits so too.
func deleteRelayed(ctx context.Context, q querier, sql string, ids []int64) error {
	b := &pgx.Batch{}
	b.Queue(`SELECT set_config('synchronous_commit', 'off', true)`)
	b.Queue(sql, ids)
	return q.SendBatch(ctx, b).Close()
}

// Round relays up to Batch rows once and returns how many it read; suspect runs Check on
// them first. The rows acknowledged are deleted even when others failed.
func (r *Relay) Round(ctx context.Context, suspect bool) (int, error) {
	if !r.cfg.Table.Shared {
		return r.round(ctx, r.pg, suspect, true)
	}
	var read int
	var pubErr error
	err := pgx.BeginFunc(ctx, r.pg, func(tx pgx.Tx) error {
		var err error
		read, err = r.round(ctx, tx, suspect, false)
		if errors.Is(err, errPublish) {
			pubErr, err = err, nil // commit the deletes of what was acknowledged
		}
		return err
	})
	if err != nil {
		return 0, err
	}
	return read, pubErr
}

// errPublish marks a round whose acknowledged rows were deleted but others were not relayed.
var errPublish = errors.New("outbox: not every row relayed")

func (r *Relay) round(ctx context.Context, q querier, suspect, ownDelete bool) (int, error) {
	rows, err := r.read(ctx, q)
	if err != nil || len(rows) == 0 {
		return 0, err
	}
	read := len(rows)
	var drop []int64
	if suspect && r.cfg.Check != nil {
		if rows, drop, err = r.cfg.Check(ctx, rows); err != nil {
			return 0, fmt.Errorf("check rows: %w", err)
		}
	}
	var spans map[int64]trace.Span
	if r.tracer != nil {
		spans = r.startPublish(ctx, rows)
	}
	acked, pubErr := r.publish(ctx, rows)
	if spans != nil {
		endPublish(spans, acked, pubErr)
	}
	if ctx.Err() != nil {
		return 0, ctx.Err()
	}
	if len(acked) > 0 && r.cfg.Published != nil {
		r.cfg.Published(acked)
	}
	ids := drop
	for _, o := range acked {
		ids = append(ids, o.ID)
	}
	if len(ids) > 0 {
		dctx := ctx
		if ownDelete {
			// Deleting is the relay's own bookkeeping: finish it even when asked to stop, or
			// the rows are only published again (and de-duplicated) by the next run.
			var cancel context.CancelFunc
			dctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			defer cancel()
		}
		if err := deleteRelayed(dctx, q, r.cfg.Table.Delete, ids); err != nil {
			return 0, fmt.Errorf("delete relayed rows: %w", err)
		}
		r.relayed.Add(float64(len(acked)))
		r.dropped.Add(float64(len(drop)))
	}
	if pubErr != nil {
		return 0, fmt.Errorf("%w (%d of %d): %w", errPublish, len(acked), read, pubErr)
	}
	return read, nil
}

func (r *Relay) read(ctx context.Context, q querier) ([]Row, error) {
	args := append(append([]any(nil), r.cfg.Table.Args...), r.cfg.Batch)
	rows, err := q.Query(ctx, r.cfg.Table.Select, args...)
	if err != nil {
		return nil, fmt.Errorf("read outbox: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Row, error) { return r.cfg.Table.Scan(rows) })
	if err != nil {
		return nil, fmt.Errorf("read outbox: %w", err)
	}
	return out, nil
}

// publish sends rows in waves of at most one row per Key and returns those acknowledged;
// the first failed wave ends it.
func (r *Relay) publish(ctx context.Context, rows []Row) ([]Row, error) {
	// Publishes whose connection is lost fail at once (their acks would never come), and the
	// round is tried again when NATS is back, instead of after AckTimeout.
	ctx, cancel := natsx.UntilLost(ctx, r.js.Conn())
	defer cancel()
	var waves [][]Row
	nth := make(map[string]int, len(rows))
	for _, o := range rows {
		k := 0
		if o.Key != "" {
			k = nth[o.Key]
			nth[o.Key] = k + 1
		}
		if k == len(waves) {
			waves = append(waves, nil)
		}
		waves[k] = append(waves[k], o)
	}
	acked := make([]Row, 0, len(rows))
	for _, wave := range waves {
		if len(wave) >= natsx.MinAtomicBatch && r.atomic(ctx, wave[0].Subject) {
			wave = r.publishBatches(ctx, wave, &acked)
		}
		if err := r.publishEach(ctx, wave, &acked); err != nil {
			return acked, err
		}
	}
	return acked, nil
}

// publishBatches sends wave in atomic batches, appending the rows acknowledged to acked, and
// returns the rows still to send: a tail too short for a batch, or those of the first batch
// that failed (a Nats-Msg-Id
// already in the stream fails its whole batch: a row published again after a crash) and
// every one after it, for publishEach, whose single publishes JetStream de-duplicates one
// by one.
func (r *Relay) publishBatches(ctx context.Context, wave []Row, acked *[]Row) []Row {
	for len(wave) >= natsx.MinAtomicBatch {
		n := min(len(wave), natsx.MaxAtomicBatch)
		msgs := make([]*nats.Msg, n)
		for i, o := range wave[:n] {
			msgs[i] = &nats.Msg{Subject: o.Subject, Data: o.Data, Header: o.header()}
			msgs[i].Header.Set(jetstream.MsgIDHeader, o.MsgID)
		}
		if _, err := natsx.PublishAtomic(ctx, r.js, msgs, r.cfg.AckTimeout); err != nil {
			r.batchFailures.Inc()
			return wave
		}
		r.batches.Inc()
		*acked = append(*acked, wave[:n]...)
		wave = wave[n:]
	}
	return nil
}

// publishEach sends wave's rows each alone, appending those acknowledged to acked.
func (r *Relay) publishEach(ctx context.Context, wave []Row, acked *[]Row) error {
	if len(wave) == 0 {
		return nil
	}
	timeout := time.NewTimer(r.cfg.AckTimeout)
	defer timeout.Stop()
	var errs []error
	futs := make([]jetstream.PubAckFuture, 0, len(wave))
	for _, o := range wave {
		f, err := r.js.PublishMsgAsync(&nats.Msg{Subject: o.Subject, Data: o.Data, Header: o.header()}, jetstream.WithMsgID(o.MsgID))
		if err != nil {
			errs = append(errs, fmt.Errorf("publish %s: %w", o.MsgID, err))
			break
		}
		futs = append(futs, f)
	}
	for i, f := range futs {
		select {
		case <-f.Ok():
			*acked = append(*acked, wave[i])
		case err := <-f.Err():
			errs = append(errs, fmt.Errorf("publish %s: %w", wave[i].MsgID, err))
		case <-timeout.C:
			return fmt.Errorf("%w (%s)", ErrNotAcked, r.cfg.AckTimeout)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return errors.Join(errs...)
}

// atomic says whether the stream of subject allows atomic batches, looked up once; a failed
// look-up says no and is tried again next time.
func (r *Relay) atomic(ctx context.Context, subject string) bool {
	if v := r.allowsAtomic.Load(); v != nil {
		return *v
	}
	name, err := r.js.StreamNameBySubject(ctx, subject)
	if err != nil {
		return false
	}
	v, err := natsx.AllowsAtomic(ctx, r.js, name)
	if err != nil {
		return false
	}
	r.allowsAtomic.Store(&v)
	return v
}

// header is a row's message header: its traceparent, if any (the publish adds the id).
func (o Row) header() nats.Header {
	if o.Traceparent == "" {
		return nats.Header{}
	}
	return nats.Header{"traceparent": []string{o.Traceparent}}
}
