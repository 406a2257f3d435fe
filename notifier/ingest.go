package notifier

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/lock-sensors/lock-sensors/internal/backoff"
	"github.com/lock-sensors/lock-sensors/internal/crashpoint"
	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/lease"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
)

// BatchDefault is Config.Batch: rows per ingest, claim or finish transaction.
const BatchDefault = 256

// ingestRetryMax bounds the pause between tries of a batch that failed.
const ingestRetryMax = 5 * time.Second

// ingest turns partition p of EVENTS into delivery rows as the owner of epoch, acknowledging
// each message only after its rows are committed, until ctx is done (nil) or a batch is
// fenced (an error wrapping lease.ErrFenced: another process owns p now).
func (n *Notifier) ingest(ctx context.Context, p int, epoch int64) error {
	msgs := make(chan jetstream.Msg, 4*n.cfg.Batch)
	batch := make([]jetstream.Msg, 0, n.cfg.Batch)
	retry := backoff.New(100*time.Millisecond, ingestRetryMax)
	for {
		// gone says the consumer was deleted under the subscription (by a process that
		// claimed p while this one still held it, or by an operator): Consume stops then,
		// and without a new consumer this partition's events would wait forever.
		gone := make(chan struct{}, 1)
		var cc jetstream.ConsumeContext
		for {
			var err error
			if cc, err = n.consume(ctx, p, msgs, gone); err == nil {
				break
			}
			n.log.Warn("cannot consume EVENTS yet; retrying", "partition", p, "err", err)
			if !backoff.Sleep(ctx, time.Second) {
				return nil
			}
		}
		n.log.Info("consuming EVENTS", "partition", p, "epoch", epoch)
		err := n.ingestFrom(ctx, p, epoch, msgs, gone, batch, retry)
		cc.Stop()
		if err != nil || ctx.Err() != nil {
			return err
		}
		n.log.Warn("the EVENTS consumer went away; creating it again", "partition", p)
	}
}

// ingestFrom ingests msgs in batches until ctx is done (nil), a batch is fenced (the error),
// or gone fires (nil, with ctx alive: the caller consumes again).
func (n *Notifier) ingestFrom(ctx context.Context, p int, epoch int64, msgs <-chan jetstream.Msg, gone <-chan struct{}, batch []jetstream.Msg, retry *backoff.Backoff) error {
	for {
		batch = batch[:0]
		select {
		case m := <-msgs:
			batch = append(batch, m)
		case <-gone:
			return nil
		case <-ctx.Done():
			return nil
		}
	more:
		for len(batch) < n.cfg.Batch {
			select {
			case m := <-msgs:
				batch = append(batch, m)
			default:
				break more
			}
		}
		retry.Reset()
		for {
			err := n.ingestBatch(ctx, p, epoch, batch)
			if err == nil {
				break
			}
			if errors.Is(err, lease.ErrFenced) {
				return err // unacknowledged: the new owner ingests them
			}
			n.log.Error("ingest EVENTS batch failed; retrying", "partition", p, "messages", len(batch), "err", err)
			if !retry.Wait(ctx) {
				return nil // unacknowledged: redelivered to whoever consumes next
			}
		}
	}
}

// consume (re)creates partition p's durable consumer to start after its ack floor, so that
// what a previous owner had been delivered and not acked comes at once rather than after
// AckWait (ingesting it again is idempotent), and feeds msgs from it.
func (n *Notifier) consume(ctx context.Context, p int, msgs chan<- jetstream.Msg, gone chan<- struct{}) (jetstream.ConsumeContext, error) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	name := "notifier-" + strconv.Itoa(p)
	cfg := jetstream.ConsumerConfig{
		Durable:       name,
		Description:   "webhook notifier, partition " + strconv.Itoa(p),
		FilterSubject: natsx.EventsPartitionFilter(p),
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       30 * time.Second,
		MaxAckPending: 8 * n.cfg.Batch,
		DeliverPolicy: jetstream.DeliverAllPolicy,
	}
	old, err := n.js.Consumer(cctx, natsx.EventsStream, name)
	switch {
	case err == nil:
		floor := old.CachedInfo().AckFloor.Stream
		if err := n.js.DeleteConsumer(cctx, natsx.EventsStream, name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return nil, fmt.Errorf("delete consumer %s: %w", name, err)
		}
		if floor > 0 {
			cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, floor+1
		}
	case !errors.Is(err, jetstream.ErrConsumerNotFound):
		return nil, fmt.Errorf("consumer %s: %w", name, err)
	}
	cons, err := n.js.CreateConsumer(cctx, natsx.EventsStream, cfg)
	if err != nil {
		return nil, fmt.Errorf("consumer for partition %d: %w", p, err)
	}
	return cons.Consume(func(m jetstream.Msg) {
		select {
		case msgs <- m:
		case <-ctx.Done():
		}
	}, jetstream.PullMaxMessages(2*n.cfg.Batch), jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
		n.log.Debug("EVENTS consumer", "partition", p, "err", err)
		if errors.Is(err, jetstream.ErrConsumerDeleted) || errors.Is(err, jetstream.ErrConsumerNotFound) {
			select {
			case gone <- struct{}{}:
			default:
			}
		}
	}))
}

// ingestBatch writes the deliveries of the real events of batch, from partition p (and the
// records of what they supersede) in one transaction, then acknowledges the messages. The
// transaction commits only while epoch is p's current one (lease.ErrFenced otherwise).
func (n *Notifier) ingestBatch(ctx context.Context, p int, epoch int64, batch []jetstream.Msg) error {
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
		// First, so that a claim by another process waits for this transaction or fences it.
		if err := lease.Check(ctx, tx, Name, p, epoch); err != nil {
			return err
		}
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
		n.relay.Wake()
	}
	return nil
}
