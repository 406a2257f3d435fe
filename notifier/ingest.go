package notifier

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/lock-sensors/lock-sensors/internal/backoff"
	"github.com/lock-sensors/lock-sensors/internal/crashpoint"
	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
)

// BatchDefault is Config.Batch: rows per ingest, claim or finish transaction.
const BatchDefault = 256

// ingest turns EVENTS messages into delivery rows, acknowledging each message only after
// its rows are committed.
func (n *Notifier) ingest(ctx context.Context) {
	msgs := make(chan jetstream.Msg, 4*n.cfg.Batch)
	var ccs []jetstream.ConsumeContext
	defer func() {
		for _, cc := range ccs {
			cc.Stop()
		}
	}()
	for _, p := range n.cfg.Partitions {
		for {
			cc, err := n.consume(ctx, p, msgs)
			if err == nil {
				ccs = append(ccs, cc)
				break
			}
			n.log.Warn("cannot consume EVENTS yet; retrying", "partition", p, "err", err)
			if !backoff.Sleep(ctx, time.Second) {
				return
			}
		}
	}
	n.log.Info("consuming EVENTS", "partitions", fmt.Sprint(n.cfg.Partitions))
	batch := make([]jetstream.Msg, 0, n.cfg.Batch)
	retry := backoff.New(100*time.Millisecond, 5*time.Second)
	for {
		batch = batch[:0]
		select {
		case m := <-msgs:
			batch = append(batch, m)
		case <-ctx.Done():
			return
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
			err := n.ingestBatch(ctx, batch)
			if err == nil {
				break
			}
			n.log.Error("ingest EVENTS batch failed; retrying", "messages", len(batch), "err", err)
			if !retry.Wait(ctx) {
				return // unacknowledged: redelivered to whoever consumes next
			}
		}
	}
}

func (n *Notifier) consume(ctx context.Context, p int, msgs chan<- jetstream.Msg) (jetstream.ConsumeContext, error) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cons, err := n.js.CreateOrUpdateConsumer(cctx, natsx.EventsStream, jetstream.ConsumerConfig{
		Durable:       "notifier-" + strconv.Itoa(p),
		Description:   "webhook notifier, partition " + strconv.Itoa(p),
		FilterSubject: natsx.EventsPartitionFilter(p),
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       30 * time.Second,
		MaxAckPending: 8 * n.cfg.Batch,
		DeliverPolicy: jetstream.DeliverAllPolicy,
	})
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
	}))
}

// ingestBatch writes the deliveries of the real events of batch (and the records of what
// they supersede) in one transaction, then acknowledges the messages.
func (n *Notifier) ingestBatch(ctx context.Context, batch []jetstream.Msg) error {
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
