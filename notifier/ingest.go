package notifier

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"

	"github.com/lock-sensors/lock-sensors/internal/backoff"
	"github.com/lock-sensors/lock-sensors/internal/crashpoint"
	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/lease"
	"github.com/lock-sensors/lock-sensors/internal/logread"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/pgtx"
)

// BatchDefault is Config.Batch: rows per ingest, claim or finish transaction.
const BatchDefault = 256

// ingestRetryMax bounds the pause between tries of a batch that failed.
const ingestRetryMax = 5 * time.Second

// leasingTxTimeout bounds a transaction that leases deliveries (intake, claim) and runs on
// after its context ended.
const leasingTxTimeout = 10 * time.Second

// seeThrough is the context of a transaction that leases deliveries: none when ctx has
// already ended, and otherwise one that outlives ctx by up to leasingTxTimeout. Abandoned
// after its COMMIT was sent, such a transaction could still commit on the server, and the
// rows it leased for this process's dispatcher would then wait out their lease with no one
// to attempt or give them back; seen through, the caller learns its outcome and hands on or
// gives back what it leased.
func seeThrough(ctx context.Context) (context.Context, context.CancelFunc, error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), leasingTxTimeout)
	return tctx, cancel, nil
}

// ingestIdleWait is how long a read of an idle partition waits for an event; a delivery
// lost at the tail is noticed after it.
const ingestIdleWait = time.Second

// ingest turns partition p of EVENTS into delivery rows as the owner of epoch, acknowledging
// each message only after its rows are committed, until ctx is done (nil) or a batch is
// fenced (an error wrapping lease.ErrFenced: another process owns p now). It reads the
// partition as contiguous runs (logread): revision n of a sensor is always taken in before
// revision n+1, also when a pull answer is lost with a NATS node. Where it resumes is the
// partition's position in Postgres (position.go).
func (n *Notifier) ingest(ctx context.Context, p int, epoch int64) error {
	in := &intake{p: p, epoch: epoch}
	err := n.ingestRuns(ctx, in)
	if err == nil {
		n.flushPositionAtStop(ctx, in)
	}
	return err
}

func (n *Notifier) ingestRuns(ctx context.Context, in *intake) error {
	p := in.p
	spec := n.eventsSpec(in)
	// Reads, and the tries of a batch that failed, wait longer each time; NATS coming back
	// is noticed within a second.
	readRetry := backoff.New(100*time.Millisecond, time.Second)
	retry := backoff.New(100*time.Millisecond, ingestRetryMax)
	var r *logread.Reader
	var err error
	for r == nil {
		if r, err = logread.Open(ctx, n.js, spec); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, lease.ErrFenced) {
				return err // found by the position's write
			}
			n.log.Warn("cannot consume EVENTS yet; retrying", "partition", p, "err", err)
			readRetry.Wait(ctx)
		}
	}
	n.log.Info("consuming EVENTS", "partition", p, "epoch", in.epoch)
	for ctx.Err() == nil {
		if err := n.flushPosition(ctx, in); errors.Is(err, lease.ErrFenced) {
			return err
		} else if err != nil && ctx.Err() == nil {
			n.log.Warn("write EVENTS position; retrying", "partition", p, "err", err)
		}
		batch, err := r.Fetch(ctx, n.cfg.Batch, ingestIdleWait)
		if err != nil {
			if errors.Is(err, lease.ErrFenced) {
				return err // at a reopen's write of the position
			}
			if ctx.Err() == nil {
				n.log.Warn("read EVENTS; retrying", "partition", p, "err", err)
				readRetry.Wait(ctx)
			}
			continue
		}
		readRetry.Reset()
		if len(batch) == 0 {
			continue
		}
		retry.Reset()
		for {
			err := n.ingestBatch(ctx, in, batch)
			if err == nil {
				break
			}
			if errors.Is(err, lease.ErrFenced) {
				return err // unacknowledged: the new owner ingests them
			}
			n.log.Error("ingest EVENTS batch failed; retrying", "partition", p, "messages", len(batch), "err", err)
			if !retry.Wait(ctx) {
				return nil // not taken in: the next owner starts at the position
			}
		}
	}
	return nil
}

// eventsSpec is in's EVENTS consumer. Its state is kept in memory only: where it starts, at
// every (re)open, is the position (resume).
func (n *Notifier) eventsSpec(in *intake) logread.Spec {
	name := consumerName(in.p)
	return logread.Spec{
		Stream: natsx.EventsStream, Filter: natsx.EventsPartitionFilter(in.p), Durable: name,
		Description: "webhook notifier, partition " + strconv.Itoa(in.p),
		AckPolicy:   jetstream.AckExplicitPolicy, AckWait: 30 * time.Second, MaxAckPending: 8 * n.cfg.Batch,
		MemoryStorage: true,
		Resume:        func(ctx context.Context) (uint64, error) { return n.resume(ctx, in) },
		OnGap:         n.gaps.OnGap(name),
	}
}

// ingestBatch writes the deliveries of the real events of batch, from in's partition (and
// the records of what they supersede), and the partition's position after batch, in one
// transaction, then acknowledges the messages. The transaction commits only while in's epoch
// is the partition's current one (lease.ErrFenced otherwise).
func (n *Notifier) ingestBatch(ctx context.Context, in *intake, batch []jetstream.Msg) (err error) {
	p := in.p
	var last uint64 // the stream sequence of batch's last message
	if md, err := batch[len(batch)-1].Metadata(); err == nil {
		last = md.Sequence.Stream
	}
	evs, payloads, ok, err := n.checkBatch(ctx, batch)
	if err != nil {
		return err
	}
	if len(evs) == 0 {
		// All set aside: no transaction; the position moves with the next one, or on its own.
		in.took(last)
		crashpoint.Hit(CrashAfterSetAsideRun)
		return nil
	}
	pos := position{seq: max(in.done, last), stream: in.stream}
	var tps []string // the intake spans' traceparents, kept on the deliveries while tracing
	if n.tracer != nil {
		var spans []trace.Span
		spans, tps = n.startIntake(ctx, evs, ok)
		defer func() { endIntake(spans, err) }()
	}
	took, err := n.intakeTx(ctx, in, pos, evs, payloads, tps)
	if err != nil {
		return err
	}
	created, recs, late, handed := took.ins.created, took.recs, took.late, took.handed
	in.took(pos.seq)
	if pos.stream != "" {
		in.saved, in.savedAt = pos, time.Now()
	}
	crashpoint.Hit(CrashAfterIngestCommit)
	committed := time.Now()
	for _, m := range ok {
		if md, err := m.Metadata(); err == nil {
			n.m.intake.Between(md.Timestamp, committed)
		}
		if err := m.Ack(); err != nil {
			// Redelivered later and skipped by (event_id, client_id): harmless.
			n.log.Debug("ack EVENTS message", "err", err)
		}
	}
	for _, r := range recs[:late] {
		n.m.late.Inc()
		n.log.Error("an event came after a newer revision of its sensor for this client: recorded superseded, never sent",
			"event_id", r.EventID, "client_id", r.ClientID, "sensor_id", r.SensorID, "partition", p)
	}
	n.m.events.Add(float64(len(evs)))
	n.m.created.Add(float64(created))
	n.count(recs)
	n.handOff(ctx, handed)
	if len(handed) < len(took.ins.ids) {
		poke(n.wake) // rows left to claim
	}
	if len(recs) > 0 {
		n.relay.Wake()
	}
	return nil
}

// intook is what an intake transaction wrote: the deliveries, the attempt records of what
// they superseded (the first late of them created superseded), and the rows it leased.
type intook struct {
	ins    inserted
	recs   []event.Attempt
	late   int
	handed []claimed
}

// intakeTx writes evs' deliveries, leases those that may go at once (handoff.go), and
// moves in's position to pos, in one transaction fenced by in's epoch.
// Once begun, it is seen through (seeThrough) even when ctx ends: the partition moved to
// another process, or this one stopping. A fence that failed meanwhile rolls it back.
func (n *Notifier) intakeTx(ctx context.Context, in *intake, pos position, evs []event.Event, payloads [][]byte, tps []string) (intook, error) {
	var t intook
	ctx, cancel, err := seeThrough(ctx)
	if err != nil {
		return t, err
	}
	defer cancel()
	begun := time.Now()
	err = pgtx.Run(ctx, n.db, func(tx *pgtx.Tx) error {
		t = intook{}
		// The fence first, so that a claim by another process waits for this transaction or
		// fences it; in the INSERT's round trip.
		f := fence{
			queue: func(b *pgx.Batch) { lease.QueueCheck(b, Name, in.p) },
			read:  func(br pgx.BatchResults) error { return lease.ReadCheck(br, Name, in.p, in.epoch) },
		}
		ins, recs, late, err := insertDeliveries(ctx, tx, f, evs, payloads, tps)
		if err != nil {
			return err
		}
		var l intakeLease
		if free := n.freeSlots(); len(ins.ids) > 0 && free > 0 {
			l = leasable(ins, n.ep.capacity(n.clock.Now()), free, begun)
		}
		w := &pgx.Batch{}
		l.queue(w, n.lease)
		rest := len(w.QueuedQueries)
		if err := queueOutbox(w, recs); err != nil {
			return err
		}
		if pos.stream != "" {
			queuePosition(w, in.p, pos)
		}
		rest = len(w.QueuedQueries) - rest
		return tx.Commit(ctx, w, func(br pgx.BatchResults) error {
			cs, err := l.read(br)
			if err != nil {
				return err
			}
			for range rest {
				if _, err := br.Exec(); err != nil {
					return err
				}
			}
			t = intook{ins: ins, recs: recs, late: late, handed: cs}
			return nil
		})
	})
	return t, err
}
