package projector

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/lock-sensors/lock-sensors/internal/crashpoint"
	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/partition"
	"github.com/lock-sensors/lock-sensors/internal/setaside"
)

// StateProjection is the checkpoint name of the state projector.
const StateProjection = "state"

// Crash points of the state projector and its relay (see internal/crashpoint).
const (
	CrashStateAfterCommit  = "state.after_commit"
	CrashRelayAfterPublish = "relay.after_publish"
)

// StateConfig configures the state projector and its outbox relay.
type StateConfig struct {
	// Partitions are the READINGS partitions this process owns.
	Partitions partition.Set
	// PartitionCount is LOCKS_PARTITIONS, the number of partitions of READINGS.
	PartitionCount int
	// BatchSize is the most READINGS messages applied in one transaction (default 1000).
	BatchSize int
	// AckWait is the consumers' ack wait (default 2m): a batch is acked after its commit,
	// so it must exceed the slowest transaction.
	AckWait time.Duration
	// IdleWait is how long an idle partition waits for its next message before checking
	// its consumer (default 1s).
	IdleWait time.Duration
	// RelayPoll is how often the relay looks at the outbox without a nudge (default 2s):
	// every commit of this process nudges the relay of its partition at once; the poll is a
	// safety net (rows of an earlier owner of the partition are relayed at start).
	RelayPoll time.Duration
	// RelayBatch is the most outbox rows published per round (default 1000).
	RelayBatch int
	// PublishTimeout bounds the wait for JetStream's ack of an event (default 10s).
	PublishTimeout time.Duration
	// CacheSensors bounds the rows kept in memory per partition between batches (default
	// 100,000; about 200 bytes each). A full cache is emptied and refilled.
	CacheSensors int
}

func (c *StateConfig) setDefaults() {
	if c.BatchSize == 0 {
		c.BatchSize = 1000
	}
	if c.AckWait == 0 {
		c.AckWait = 2 * time.Minute
	}
	if c.IdleWait == 0 {
		c.IdleWait = time.Second
	}
	if c.RelayPoll == 0 {
		c.RelayPoll = 2 * time.Second
	}
	if c.RelayBatch == 0 {
		c.RelayBatch = 1000
	}
	if c.PublishTimeout == 0 {
		c.PublishTimeout = 10 * time.Second
	}
	if c.CacheSensors == 0 {
		c.CacheSensors = 100_000
	}
}

// Validate reports the first bad field.
func (c StateConfig) Validate() error {
	switch {
	case c.PartitionCount < 1:
		return fmt.Errorf("state projector: partition count %d < 1", c.PartitionCount)
	case len(c.Partitions) == 0:
		return errors.New("state projector: owns no partition")
	case c.BatchSize < 1 || c.BatchSize > 10000:
		return fmt.Errorf("state projector: batch size %d not in 1..10000", c.BatchSize)
	case c.RelayBatch < 1:
		return fmt.Errorf("state projector: relay batch %d < 1", c.RelayBatch)
	case c.AckWait < time.Second:
		return fmt.Errorf("state projector: ack wait %s < 1s", c.AckWait)
	case c.IdleWait <= 0 || c.RelayPoll <= 0 || c.PublishTimeout <= 0:
		return errors.New("state projector: idle wait, relay poll and publish timeout must be > 0")
	}
	for _, p := range c.Partitions {
		if p < 0 || p >= c.PartitionCount {
			return fmt.Errorf("state projector: partition %d out of range 0-%d", p, c.PartitionCount-1)
		}
	}
	return nil
}

// StateDeps are what the state projector runs on.
type StateDeps struct {
	JS  jetstream.JetStream
	PG  *pgxpool.Pool
	Log *slog.Logger
	Reg prometheus.Registerer
}

// State is the state projector: per owned partition, a durable pull consumer on READINGS
// whose batches are applied to sensor_state in one transaction each (with the checkpoint and
// the outbox rows of the events they cause), and a relay publishing the outbox to EVENTS.
type State struct {
	cfg   StateConfig
	js    jetstream.JetStream
	pg    *pgxpool.Pool
	log   *slog.Logger
	m     *stateMetrics
	wake  map[int]chan struct{}
	relay *Relay
	// refused are the partitions whose checkpoints do not belong to READINGS (checkpoint.go).
	refused *refusals
	// setAside records the READINGS messages that can never be applied.
	setAside *setaside.Recorder
}

// NewState checks the configuration and registers the metrics.
func NewState(cfg StateConfig, d StateDeps) (*State, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if d.JS == nil || d.PG == nil || d.Log == nil || d.Reg == nil {
		return nil, errors.New("state projector: JS, PG, Log and Reg are required")
	}
	m, err := newStateMetrics(d.Reg)
	if err != nil {
		return nil, err
	}
	s := &State{cfg: cfg, js: d.JS, pg: d.PG, log: d.Log.With("part", "state"), m: m,
		wake: make(map[int]chan struct{}, len(cfg.Partitions))}
	for _, p := range cfg.Partitions {
		s.wake[p] = make(chan struct{}, 1)
	}
	if s.setAside, err = setaside.NewRecorder(StateProjection, d.JS, s.log, d.Reg); err != nil {
		return nil, err
	}
	s.relay, err = newRelay(cfg, d, s.wake)
	if err != nil {
		return nil, err
	}
	if s.refused, err = newRefusals(d.Reg, StateProjection, cfg.Partitions, s.log); err != nil {
		return nil, err
	}
	return s, nil
}

// Run applies the owned partitions and relays their outbox until ctx is done. It returns
// nil after a clean stop. A message it can never apply is set aside (see decodeBatch) and
// stops nothing.
func (s *State) Run(ctx context.Context) error {
	g, gctx := errgroup.WithContext(ctx)
	for _, p := range s.cfg.Partitions {
		g.Go(func() error { return s.runPartition(gctx, p) })
	}
	g.Go(func() error { return s.relay.Run(gctx) })
	err := g.Wait()
	if ctx.Err() != nil && (err == nil || errors.Is(err, context.Canceled)) {
		return nil
	}
	return err
}

// Ready is nil unless a partition is stopped because its checkpoint does not belong to
// READINGS (for /readyz): the error names the partitions and the way out.
func (s *State) Ready(ctx context.Context) error { return s.refused.Ready(ctx) }

func stateConsumerName(p int) string { return "state-p" + strconv.Itoa(p) }

// statePartWorker follows one partition. Its consumer is a cursor over READINGS that starts at
// the Postgres checkpoint; whenever delivery is not the plain next message (a redelivery,
// a lost delivery after a NATS restart, an error), the consumer is recreated from the
// checkpoint, so messages are always applied in stream order and none is skipped.
type statePartWorker struct {
	s     *State
	p     int
	log   *slog.Logger
	cons  jetstream.Consumer
	next  uint64 // the consumer sequence expected next
	cache *stateCache
}

func (s *State) runPartition(ctx context.Context, p int) error {
	w := &statePartWorker{s: s, p: p, log: s.log.With("partition", p), cache: newStateCache(s.cfg.CacheSensors)}
	var fails int
	backoff := func() {
		fails++
		d := min(time.Duration(fails)*100*time.Millisecond, 3*time.Second)
		select {
		case <-ctx.Done():
		case <-time.After(d):
		}
	}
	for ctx.Err() == nil {
		if w.cons == nil {
			if err := w.reset(ctx); err != nil {
				var mm *CheckpointMismatchError
				switch {
				case errors.As(err, &mm):
					// Stopped loudly, and looked at again (up to every 3 s) for the store
					// to come back or the checkpoints to be rebased; other partitions go on.
					s.refused.refuse(mm)
				case ctx.Err() == nil:
					w.log.Warn("recreate READINGS consumer", "err", err)
				}
				backoff()
				continue
			}
			s.refused.clear(p)
		}
		msgs, err := w.fetch(ctx)
		if err != nil {
			if ctx.Err() == nil {
				w.log.Warn("fetch from READINGS", "err", err)
				w.cons = nil
				backoff()
			}
			continue
		}
		if len(msgs) == 0 {
			continue
		}
		good, gap := w.inOrder(msgs)
		if len(good) > 0 {
			// A batch under way is finished even when asked to stop: it is one transaction
			// and one ack, and stopping between them only costs a redelivery.
			actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.AckWait/2)
			err := s.applyBatch(actx, p, good, w.cache)
			if err == nil {
				crashpoint.Hit(CrashStateAfterCommit)
				s.nudge(p)
				// AckAll: the last message acks the batch. A lost ack reply (NATS restarting)
				// must not hold the partition: the checkpoint makes a missing ack harmless.
				ackCtx, ackCancel := context.WithTimeout(actx, 5*time.Second)
				aerr := good[len(good)-1].DoubleAck(ackCtx)
				ackCancel()
				if aerr != nil {
					w.log.Debug("ack batch; the consumer will be recreated from the checkpoint", "err", aerr)
					gap = true
				}
			}
			cancel()
			if err != nil {
				w.log.Warn("apply batch", "err", err, "messages", len(good))
				w.cons = nil
				backoff()
				continue
			}
		}
		fails = 0
		if gap {
			w.cons = nil
		}
	}
	return nil
}

// reset recreates the partition's durable consumer to start right after the checkpoint,
// once the checkpoint is known to belong to READINGS (a *CheckpointMismatchError otherwise).
func (w *statePartWorker) reset(ctx context.Context) error {
	cp, stream, err := w.s.checkpoint(ctx, w.p)
	if err != nil {
		return err
	}
	pos, err := readingsPosition(ctx, w.s.js)
	if err != nil {
		return err
	}
	if err := checkCheckpoint(StateProjection, w.p, cp, stream, pos); err != nil {
		return err
	}
	// The batches' transactions hold the checkpoint to this stream.
	w.cache.stream = pos.id
	name := stateConsumerName(w.p)
	if err := w.s.js.DeleteConsumer(ctx, natsx.ReadingsStream, name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return fmt.Errorf("delete consumer %s: %w", name, err)
	}
	cfg := jetstream.ConsumerConfig{
		Durable:       name,
		Description:   "state projector, partition " + strconv.Itoa(w.p),
		FilterSubject: natsx.ReadingsPartitionFilter(w.p),
		AckPolicy:     jetstream.AckAllPolicy,
		AckWait:       w.s.cfg.AckWait,
		MaxAckPending: 4 * w.s.cfg.BatchSize,
		MaxDeliver:    -1,
		DeliverPolicy: jetstream.DeliverAllPolicy,
	}
	if cp > 0 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, cp+1
	}
	cons, err := w.s.js.CreateConsumer(ctx, natsx.ReadingsStream, cfg)
	if err != nil {
		return fmt.Errorf("create consumer %s: %w", name, err)
	}
	w.cons, w.next = cons, 1
	w.log.Debug("READINGS consumer starts after the checkpoint", "checkpoint", cp)
	return nil
}

// fetch returns what is there at once, up to a batch; when nothing is, it waits up to
// IdleWait for one message and then takes what has come with it.
func (w *statePartWorker) fetch(ctx context.Context) ([]jetstream.Msg, error) {
	batch := w.s.cfg.BatchSize
	msgs, err := stateDrain(w.cons.FetchNoWait(batch))
	if err != nil || len(msgs) > 0 {
		return msgs, err
	}
	fctx, cancel := context.WithTimeout(ctx, w.s.cfg.IdleWait)
	msgs, err = stateDrain(w.cons.Fetch(1, jetstream.FetchContext(fctx)))
	cancel()
	if err != nil && errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
		err = nil
	}
	if err != nil {
		return nil, err
	}
	if len(msgs) == 0 {
		// Idle: messages delivered to us but lost (a NATS restart) would wait for AckWait;
		// the consumer's pending count shows them now.
		info, err := w.cons.Info(ctx)
		if err != nil {
			return nil, fmt.Errorf("consumer info: %w", err)
		}
		w.s.m.lag.WithLabelValues(strconv.Itoa(w.p)).Set(float64(info.NumPending))
		if info.NumPending == 0 {
			w.s.m.lagSeconds.WithLabelValues(strconv.Itoa(w.p)).Set(0)
		}
		if info.NumAckPending > 0 {
			w.cons = nil
		}
		return nil, nil
	}
	if batch > 1 {
		more, err := stateDrain(w.cons.FetchNoWait(batch - 1))
		if err != nil {
			// Keep the first; the error shows again on the next fetch.
			return msgs, nil
		}
		msgs = append(msgs, more...)
	}
	return msgs, nil
}

func stateDrain(b jetstream.MessageBatch, err error) ([]jetstream.Msg, error) {
	if err != nil {
		return nil, err
	}
	var out []jetstream.Msg
	for m := range b.Messages() {
		out = append(out, m)
	}
	if err := b.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
		return out, err
	}
	return out, nil
}

// inOrder keeps the prefix of msgs that are first deliveries in consumer order; gap says
// something else came and the consumer must be recreated.
func (w *statePartWorker) inOrder(msgs []jetstream.Msg) ([]jetstream.Msg, bool) {
	for i, m := range msgs {
		md, err := m.Metadata()
		if err != nil || md.NumDelivered != 1 || md.Sequence.Consumer != w.next {
			return msgs[:i], true
		}
		w.next++
		if i == len(msgs)-1 {
			w.s.m.lag.WithLabelValues(strconv.Itoa(w.p)).Set(float64(md.NumPending))
			w.s.m.lagSeconds.WithLabelValues(strconv.Itoa(w.p)).Set(time.Since(md.Timestamp).Seconds())
		}
	}
	return msgs, false
}

func (s *State) nudge(p int) {
	select {
	case s.wake[p] <- struct{}{}:
	default:
	}
}

// checkpoint returns partition p's checkpoint and the stream it names ("" when unknown).
func (s *State) checkpoint(ctx context.Context, p int) (uint64, string, error) {
	var seq int64
	var stream string
	err := s.pg.QueryRow(ctx, `SELECT seq, coalesce(stream, '') FROM checkpoints WHERE projection = $1 AND partition = $2`,
		StateProjection, p).Scan(&seq, &stream)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, "", nil
	}
	if err != nil {
		return 0, "", fmt.Errorf("read checkpoint of partition %d: %w", p, err)
	}
	return uint64(seq), stream, nil
}

// stateRow is a sensor_state row.
type stateRow struct {
	data            uint8
	lastSeen        time.Time
	lastReadingTime time.Time
	changedAt       time.Time
	revision        int64
	lost            bool
	lastSeq         uint64
}

// step applies one READINGS message to a sensor's row (ok false: no row yet) and appends
// the events it causes; touched says the row was written. It is the whole of the state projector's logic, a pure function of
// the row and the message, so that every replay decides the same.
func stateStep(cur stateRow, ok bool, l event.Log, p int, seq uint64, evs []event.Event) (_ stateRow, touched bool, _ []event.Event) {
	emit := func(typ string, at time.Time, data uint8, prev *uint8) {
		cur.revision++
		evs = append(evs, event.Event{V: event.Version, ID: event.ID(l.SensorID, cur.revision), Type: typ,
			OccurredAt: at, SensorID: l.SensorID, Data: data, PreviousData: prev, Revision: cur.revision,
			Partition: p, Seq: seq})
	}
	switch l.Kind {
	case event.KindReading:
		if !ok {
			cur = stateRow{data: l.Data, changedAt: l.Time}
			emit(event.TypeStateChanged, l.Time, l.Data, nil)
		} else {
			prev := cur.data
			if cur.lost {
				cur.lost = false
				emit(event.TypeConnectionRestored, l.ReceivedTime, l.Data, &prev)
			}
			if l.Data != prev {
				cur.data, cur.changedAt = l.Data, l.Time
				emit(event.TypeStateChanged, l.Time, l.Data, &prev)
			}
		}
		cur.lastSeen, cur.lastReadingTime, cur.lastSeq = l.ReceivedTime, l.Time, seq
		return cur, true, evs
	case event.KindLivenessTimeout:
		// Lost only if the sensor was still silent for its whole timeout when the key
		// expired; a fact overtaken by a reading is stale.
		if !ok || cur.lost || l.LostAfter <= 0 || l.ReceivedTime.Sub(cur.lastSeen) < l.LostAfter {
			return cur, false, evs
		}
		prev := cur.data
		cur.lost, cur.lastSeq = true, seq
		emit(event.TypeConnectionLost, l.ReceivedTime, cur.data, &prev)
		return cur, true, evs
	}
	return cur, false, evs
}

// stateMsg is one READINGS message ready to apply.
type stateMsg struct {
	seq uint64
	log event.Log
}

// decodeBatch parses and checks msgs. A message that can never be applied (forged or
// malformed: see event.CheckLog) is set aside before the batch commits past it, so that it
// stops nothing else; an error here is transient (NATS unreachable for the record) and the
// batch is retried.
func (s *State) decodeBatch(ctx context.Context, p int, msgs []jetstream.Msg) ([]stateMsg, error) {
	out := make([]stateMsg, 0, len(msgs))
	for _, m := range msgs {
		md, err := m.Metadata()
		if err != nil {
			return nil, fmt.Errorf("message metadata: %w", err)
		}
		l, err := prepareLog(m.Subject(), m.Data(), s.cfg.PartitionCount)
		if err != nil {
			if err := s.setAside.SetAside(ctx, natsx.ReadingsStream, md.Sequence.Stream, m.Subject(), m.Data(), err); err != nil {
				return nil, err
			}
			s.m.skipped.WithLabelValues("invalid").Inc()
			continue
		}
		out = append(out, stateMsg{seq: md.Sequence.Stream, log: l})
	}
	return out, nil
}

// prepareLog checks a READINGS message stored under subject and decodes it as stateStep
// expects it (shared with the rebuild, so that both decide on the very same input): an
// error (wrapping event.ErrInvalid) means the message is set aside, never applied.
func prepareLog(subject string, b []byte, partitions int) (event.Log, error) {
	l, err := event.CheckLog(subject, b, partitions)
	if err != nil {
		return l, err
	}
	// Postgres keeps microseconds: deciding on the same precision in memory makes the
	// outcome independent of where batches happen to be cut.
	l.ReceivedTime = l.ReceivedTime.UTC().Truncate(time.Microsecond)
	if l.Time.IsZero() {
		l.Time = l.ReceivedTime
	}
	l.Time = l.Time.UTC().Truncate(time.Microsecond)
	return l, nil
}

// stateCache holds the rows of one partition as the last commit of this process left them,
// so that a batch loads only the sensors it has not seen. It is valid only while the
// checkpoint is where that commit put it: anything else (a failed transaction, another
// writer) empties it.
type stateCache struct {
	rows map[string]stateRow
	cp   uint64 // the checkpoint after the commit the rows reflect
	// table is sensor_state's oid when the rows were loaded: a rebuild swaps another table
	// in under the same name (see rebuild.go), and the rows cached are then not its rows.
	table uint32
	max   int
	// stream is the identity of the READINGS stream the partition's consumer reads (set
	// when it is created): a batch refuses a checkpoint written on another stream, and
	// writes this one with its own. Empty: not known (the checkpoint's is kept).
	stream string
}

func newStateCache(max int) *stateCache {
	return &stateCache{rows: make(map[string]stateRow), max: max}
}

func (c *stateCache) clear() { clear(c.rows); c.cp = 0 }

const selectStateRows = `SELECT sensor_id, data, last_seen, last_reading_time, changed_at, revision, connection, last_seq
	FROM sensor_state WHERE sensor_id = ANY($1)`

func scanStateRows(rows pgx.Rows, into map[string]stateRow) error {
	defer rows.Close()
	for rows.Next() {
		var id, conn string
		var r stateRow
		var data int16
		var lastSeq int64
		if err := rows.Scan(&id, &data, &r.lastSeen, &r.lastReadingTime, &r.changedAt, &r.revision, &conn, &lastSeq); err != nil {
			return fmt.Errorf("scan sensor_state: %w", err)
		}
		r.data, r.lost, r.lastSeq = uint8(data), conn == "lost", uint64(lastSeq)
		r.lastSeen, r.lastReadingTime, r.changedAt = r.lastSeen.UTC(), r.lastReadingTime.UTC(), r.changedAt.UTC()
		into[id] = r
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("load sensor_state: %w", err)
	}
	return nil
}

// applyBatch applies msgs of partition p in one transaction: lock the checkpoint, skip what
// is at or below it, update sensor_state, write the outbox, advance the checkpoint. cache
// may be nil.
func (s *State) applyBatch(ctx context.Context, p int, msgs []jetstream.Msg, cache *stateCache) error {
	items, err := s.decodeBatch(ctx, p, msgs)
	if err != nil {
		return err
	}
	md, err := msgs[len(msgs)-1].Metadata()
	if err != nil {
		return fmt.Errorf("message metadata: %w", err)
	}
	lastSeq := md.Sequence.Stream
	if cache == nil {
		cache = newStateCache(0)
	}
	if len(cache.rows) > cache.max {
		cache.clear()
	}
	var ids, missing []string
	seen := make(map[string]bool, len(items))
	for _, it := range items {
		if !seen[it.log.SensorID] {
			seen[it.log.SensorID] = true
			ids = append(ids, it.log.SensorID)
			if _, ok := cache.rows[it.log.SensorID]; !ok {
				missing = append(missing, it.log.SensorID)
			}
		}
	}
	start := time.Now()
	var applied, skipped int
	var evs []event.Event
	var state map[string]stateRow
	err = pgx.BeginFunc(ctx, s.pg, func(tx pgx.Tx) error {
		applied, skipped, evs = 0, 0, evs[:0]
		state = make(map[string]stateRow, len(ids))
		b := &pgx.Batch{}
		b.Queue(`INSERT INTO checkpoints (projection, partition, seq) VALUES ($1, $2, 0) ON CONFLICT DO NOTHING`, StateProjection, p)
		b.Queue(`SELECT seq, coalesce(stream, '') FROM checkpoints WHERE projection = $1 AND partition = $2 FOR UPDATE`, StateProjection, p)
		// After the checkpoint lock, which a rebuild's swap holds while renaming the tables;
		// read from the catalog (not a regclass constant) so that no cached plan keeps it.
		b.Queue(`SELECT oid FROM pg_class WHERE relname = 'sensor_state' AND relnamespace = current_schema()::regnamespace`)
		b.Queue(selectStateRows, missing)
		br := tx.SendBatch(ctx, b)
		if _, err := br.Exec(); err != nil {
			br.Close()
			return fmt.Errorf("insert checkpoint: %w", err)
		}
		var cp64 int64
		var cpStream string
		if err := br.QueryRow().Scan(&cp64, &cpStream); err != nil {
			br.Close()
			return fmt.Errorf("lock checkpoint: %w", err)
		}
		cp := uint64(cp64)
		if cp > 0 && cpStream != "" && cache.stream != "" && cpStream != cache.stream {
			// Rebased or written by a process on another stream since this consumer was
			// created: deciding by this sequence would skip or repeat readings.
			br.Close()
			return &CheckpointMismatchError{Projection: StateProjection, Partition: p, Seq: cp, Stream: cpStream, Current: cache.stream}
		}
		var table uint32
		if err := br.QueryRow().Scan(&table); err != nil {
			br.Close()
			return fmt.Errorf("look up sensor_state: %w", err)
		}
		if table != cache.table {
			cache.clear()
			cache.table = table
		}
		rows, err := br.Query()
		if err == nil {
			err = scanStateRows(rows, state)
		}
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("load sensor_state: %w", err)
		}
		if cp == cache.cp {
			for _, id := range ids {
				if r, ok := cache.rows[id]; ok {
					state[id] = r
				}
			}
		} else {
			// Not the checkpoint this process left: its cached rows may be stale.
			cache.clear()
			if len(missing) < len(ids) {
				rows, err := tx.Query(ctx, selectStateRows, ids)
				if err == nil {
					err = scanStateRows(rows, state)
				}
				if err != nil {
					return fmt.Errorf("reload sensor_state: %w", err)
				}
			}
		}
		// Loaded rows are known to exist: new sensors are inserted, known ones updated.
		exists := make(map[string]bool, len(state))
		for id := range state {
			exists[id] = true
		}
		if lastSeq <= cp {
			skipped = len(msgs)
			return nil
		}

		dirty := make(map[string]bool, len(ids))
		for _, it := range items {
			if it.seq <= cp {
				skipped++
				continue
			}
			applied++
			cur, ok := state[it.log.SensorID]
			var touched bool
			cur, touched, evs = stateStep(cur, ok, it.log, p, it.seq, evs)
			if touched {
				state[it.log.SensorID] = cur
				dirty[it.log.SensorID] = true
			}
		}

		w := &pgx.Batch{}
		var upd, ins stateColumns
		for _, id := range ids {
			if !dirty[id] {
				continue
			}
			if exists[id] {
				upd.add(id, p, state[id])
			} else {
				ins.add(id, p, state[id])
			}
		}
		queueStateRows(w, "sensor_state", &upd, &ins)
		if len(evs) > 0 {
			eid := make([]string, len(evs))
			sid := make([]string, len(evs))
			rev := make([]int64, len(evs))
			payload := make([][]byte, len(evs))
			for i, e := range evs {
				b, err := json.Marshal(e)
				if err != nil {
					return fmt.Errorf("encode event: %w", err)
				}
				eid[i], sid[i], rev[i], payload[i] = e.ID, e.SensorID, e.Revision, b
			}
			// The outbox id orders the relay: rows are inserted in event order.
			w.Queue(`INSERT INTO outbox (event_id, partition, sensor_id, revision, payload)
				SELECT e, $2, s, r, b FROM unnest($1::text[], $3::text[], $4::bigint[], $5::bytea[]) WITH ORDINALITY AS t(e, s, r, b, o)
				ORDER BY o`, eid, p, sid, rev, payload)
		}
		w.Queue(`UPDATE checkpoints SET seq = $3, stream = coalesce(nullif($4, ''), stream), updated_at = now() WHERE projection = $1 AND partition = $2`,
			StateProjection, p, int64(lastSeq), cache.stream)
		br = tx.SendBatch(ctx, w)
		if len(upd.id) > 0 {
			tag, err := br.Exec()
			if err == nil && tag.RowsAffected() != int64(len(upd.id)) {
				err = fmt.Errorf("updated %d sensor_state rows, want %d: rows vanished under the projector", tag.RowsAffected(), len(upd.id))
			}
			if err != nil {
				br.Close()
				return fmt.Errorf("update sensor_state: %w", err)
			}
		}
		if err := br.Close(); err != nil {
			return fmt.Errorf("write sensor_state, outbox and checkpoint: %w", err)
		}
		return nil
	})
	if err != nil {
		cache.clear()
		return fmt.Errorf("partition %d batch up to seq %d: %w", p, lastSeq, err)
	}
	for id, r := range state {
		cache.rows[id] = r
	}
	cache.cp = max(lastSeq, cache.cp)
	if skipped == len(msgs) {
		// Nothing written: the checkpoint stayed where it was, beyond lastSeq.
		cache.clear()
	}
	s.m.commit.Observe(time.Since(start).Seconds())
	s.m.batch.Observe(float64(len(msgs)))
	s.m.applied.Add(float64(applied))
	if skipped > 0 {
		s.m.skipped.WithLabelValues("already_applied").Add(float64(skipped))
	}
	for _, e := range evs {
		s.m.events.WithLabelValues(e.Type).Inc()
	}
	return nil
}

// stateColumns are sensor_state rows as column arrays, for unnest.
type stateColumns struct {
	id                  []string
	part                []int32
	data                []int16
	seen, read, changed []time.Time
	rev                 []int64
	conn                []string
	seq                 []int64
}

func (c *stateColumns) add(id string, p int, r stateRow) {
	conn := "online"
	if r.lost {
		conn = "lost"
	}
	c.id, c.part, c.data = append(c.id, id), append(c.part, int32(p)), append(c.data, int16(r.data))
	c.seen, c.read, c.changed = append(c.seen, r.lastSeen), append(c.read, r.lastReadingTime), append(c.changed, r.changedAt)
	c.rev, c.conn, c.seq = append(c.rev, r.revision), append(c.conn, conn), append(c.seq, int64(r.lastSeq))
}

// queueStateRows queues the writes of rows to table (sensor_state, or a rebuild's shadow):
// upd are rows known to exist, updated in place with UPDATE … FROM unnest rather than
// INSERT … ON CONFLICT (no speculative insertion), ins new rows. When upd has rows, the
// UPDATE is the batch's first statement, for the caller to check its row count.
func queueStateRows(b *pgx.Batch, table string, upd, ins *stateColumns) {
	t := pgx.Identifier{table}.Sanitize()
	if len(upd.id) > 0 {
		b.Queue(`UPDATE `+t+` s SET data = u.data, last_seen = u.last_seen,
				last_reading_time = u.last_reading_time, changed_at = u.changed_at, revision = u.revision,
				connection = u.connection, last_seq = u.last_seq
			FROM unnest($1::text[], $2::smallint[], $3::timestamptz[], $4::timestamptz[], $5::timestamptz[], $6::bigint[], $7::text[], $8::bigint[])
				AS u(sensor_id, data, last_seen, last_reading_time, changed_at, revision, connection, last_seq)
			WHERE s.sensor_id = u.sensor_id`,
			upd.id, upd.data, upd.seen, upd.read, upd.changed, upd.rev, upd.conn, upd.seq)
	}
	if len(ins.id) > 0 {
		b.Queue(`INSERT INTO `+t+` (sensor_id, partition, data, last_seen, last_reading_time, changed_at, revision, connection, last_seq)
			SELECT * FROM unnest($1::text[], $2::int[], $3::smallint[], $4::timestamptz[], $5::timestamptz[], $6::timestamptz[], $7::bigint[], $8::text[], $9::bigint[])`,
			ins.id, ins.part, ins.data, ins.seen, ins.read, ins.changed, ins.rev, ins.conn, ins.seq)
	}
}

type stateMetrics struct {
	applied prometheus.Counter
	skipped *prometheus.CounterVec
	events  *prometheus.CounterVec
	batch   prometheus.Histogram
	commit  prometheus.Histogram
	lag     *prometheus.GaugeVec
	// lagSeconds is how long the newest message fetched had been in READINGS.
	lagSeconds *prometheus.GaugeVec
}

func newStateMetrics(reg prometheus.Registerer) (*stateMetrics, error) {
	m := &stateMetrics{
		applied: prometheus.NewCounter(prometheus.CounterOpts{Name: "locks_state_applied_total",
			Help: "READINGS messages applied to sensor_state."}),
		skipped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "locks_state_skipped_total",
			Help: "READINGS messages not applied: already_applied (at or below the checkpoint) or invalid (set aside)."}, []string{"reason"}),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "locks_state_events_total",
			Help: "Events written to the outbox, by type."}, []string{"type"}),
		batch: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "locks_state_batch_size",
			Help: "READINGS messages per transaction.", Buckets: prometheus.ExponentialBuckets(1, 4, 7)}),
		commit: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "locks_state_commit_seconds",
			Help: "Time of one batch transaction, begin to commit.", Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 10)}),
		lag: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "locks_state_lag_messages",
			Help: "READINGS messages of the partition not yet delivered to the state projector."}, []string{"partition"}),
		lagSeconds: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "locks_state_lag_seconds",
			Help: "Age of the newest READINGS message fetched by the state projector (0 when caught up)."}, []string{"partition"}),
	}
	for _, c := range []prometheus.Collector{m.applied, m.skipped, m.events, m.batch, m.commit, m.lag, m.lagSeconds} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("state projector metrics: %w", err)
		}
	}
	return m, nil
}
