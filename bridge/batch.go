package bridge

import (
	"context"
	"fmt"
	"maps"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/lock-sensors/lock-sensors/internal/natsx"
)

// appendFuture is an append's outcome: jetstream.PubAckFuture, or a batched append's.
type appendFuture interface {
	Ok() <-chan *jetstream.PubAck
	Err() <-chan error
}

// batched is one reading waiting in a batch; exactly one of ok and err gets a value.
type batched struct {
	msg *nats.Msg
	ok  chan *jetstream.PubAck
	err chan error
}

func (p *batched) Ok() <-chan *jetstream.PubAck { return p.ok }
func (p *batched) Err() <-chan error            { return p.err }

// batcher appends readings to READINGS in atomic batches when the stream allows them
// (natsx.StreamsConfig.AtomicPublish). A server that syncs every write (the embedded one's
// default) then syncs once per batch instead of once per reading, which multiplies the
// appends a second (BenchmarkBareJetStreamSyncAlways measures both; BENCHMARKS.md has the
// figures). A batch is whatever readings wait when the previous one is committed, up to
// natsx.MaxAtomicBatch, so nothing waits for a batch to fill: a quiet bridge sends batches
// of one. Unlike the outbox relays it keeps atomic batches below natsx.MinAtomicBatch, for
// all their cost: a batch in flight when a bridge dies is then stored whole or not at all,
// while single appends would leave some of it stored, and the next session, which recognises
// appended readings from what READINGS holds when their redeliveries come (identity.go),
// could read that before the server has stored the last of them and record them twice.
//
// A batch is stored whole or not at all. One that fails (a Nats-Msg-Id already in the
// stream fails the whole batch, as does a timeout or a NATS restart) fails each of its
// readings' futures, and the acker retries each alone with its own Nats-Msg-Id (republish),
// exactly as after a failed single append: the de-duplication then applies per reading.
type batcher struct {
	js      jetstream.JetStream
	in      chan *batched
	m       *metrics
	timeout time.Duration
	// ctx is the session's drain context: batches go on while the acker drains.
	ctx context.Context
}

func newBatcher(ctx context.Context, js jetstream.JetStream, m *metrics, timeout time.Duration) *batcher {
	return &batcher{js: js, in: make(chan *batched, natsx.MaxAtomicBatch), m: m, timeout: timeout, ctx: ctx}
}

// add queues msg for the next batch; it blocks while a full batch waits to be sent.
func (bt *batcher) add(msg *nats.Msg) (appendFuture, error) {
	p := &batched{msg: msg, ok: make(chan *jetstream.PubAck, 1), err: make(chan error, 1)}
	select {
	case bt.in <- p:
		return p, nil
	case <-bt.ctx.Done():
		return nil, fmt.Errorf("append to READINGS: %w", bt.ctx.Err())
	}
}

// run sends batches until ctx is done; readings still queued then get ctx's error.
func (bt *batcher) run() {
	batch := make([]*batched, 0, natsx.MaxAtomicBatch)
	for {
		select {
		case p := <-bt.in:
			batch = append(batch[:0], p)
		case <-bt.ctx.Done():
			for {
				select {
				case p := <-bt.in:
					p.err <- bt.ctx.Err()
				default:
					return
				}
			}
		}
	more:
		for len(batch) < natsx.MaxAtomicBatch {
			select {
			case p := <-bt.in:
				batch = append(batch, p)
			default:
				break more
			}
		}
		bt.commit(batch)
	}
}

// commit sends one atomic batch and resolves its readings' futures. The messages sent are
// copies: the batch headers go on them, the items keep theirs for a retry alone.
func (bt *batcher) commit(batch []*batched) {
	msgs := make([]*nats.Msg, len(batch))
	for i, p := range batch {
		msgs[i] = &nats.Msg{Subject: p.msg.Subject, Data: p.msg.Data, Header: maps.Clone(p.msg.Header)}
	}
	// A batch whose connection is lost fails at once: its readings are retried alone.
	ctx, cancel := natsx.UntilLost(bt.ctx, bt.js.Conn())
	ack, err := natsx.PublishAtomic(ctx, bt.js, msgs, bt.timeout)
	cancel()
	if err != nil {
		bt.m.batchFailures.Inc()
		for _, p := range batch {
			p.err <- fmt.Errorf("atomic batch of %d: %w", len(batch), err)
		}
		return
	}
	bt.m.batches.Inc()
	first := ack.Sequence - uint64(len(batch)) + 1
	for i, p := range batch {
		p.ok <- &jetstream.PubAck{Stream: ack.Stream, Sequence: first + uint64(i), Domain: ack.Domain}
	}
}
