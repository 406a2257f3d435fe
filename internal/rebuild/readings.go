package rebuild

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/lock-sensors/lock-sensors/internal/natsx"
)

// READINGS look-ups of the runner and of the projections' listings.

// PartitionLag counts the messages of partition p after seq cp, with a consumer that lives
// only for the count, and gives the partition's last sequence.
func PartitionLag(ctx context.Context, st jetstream.Stream, p int, cp uint64) (lag, last uint64, _ error) {
	cons, err := st.CreateConsumer(ctx, jetstream.ConsumerConfig{
		FilterSubject: natsx.ReadingsPartitionFilter(p), AckPolicy: jetstream.AckNonePolicy,
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: cp + 1,
		InactiveThreshold: 10 * time.Second, MemoryStorage: true, Replicas: 1,
	})
	if err != nil {
		return 0, 0, fmt.Errorf("count READINGS of partition %d after %d: %w", p, cp, err)
	}
	lag = cons.CachedInfo().NumPending
	if err := st.DeleteConsumer(ctx, cons.CachedInfo().Name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return 0, 0, fmt.Errorf("delete the counting consumer: %w", err)
	}
	if last, err = PartitionLastSeq(ctx, st, p); err != nil {
		return 0, 0, err
	}
	return lag, last, nil
}

// PartitionLastSeq is the sequence of partition p's last message in READINGS (0: none).
func PartitionLastSeq(ctx context.Context, st jetstream.Stream, p int) (uint64, error) {
	m, err := st.GetLastMsgForSubject(ctx, natsx.ReadingsPartitionFilter(p))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("last READINGS message of partition %d: %w", p, err)
	}
	return m.Sequence, nil
}

// ResolveFromTime is the sequence of the first READINGS message stored at or after t (by
// the stream's own timestamps), or ErrNoReadingAfter.
func ResolveFromTime(ctx context.Context, js jetstream.JetStream, t time.Time) (uint64, error) {
	st, err := js.Stream(ctx, natsx.ReadingsStream)
	if err != nil {
		return 0, fmt.Errorf("look up %s: %w", natsx.ReadingsStream, err)
	}
	info := st.CachedInfo() // current: js.Stream has just asked for it
	if info.State.Msgs == 0 || t.After(info.State.LastTime) {
		// Also keeps times beyond the year 2262 (no UnixNano) away from the server.
		return 0, fmt.Errorf("%w: %s (the last one is from %s)", ErrNoReadingAfter, t.Format(time.RFC3339Nano), info.State.LastTime.Format(time.RFC3339Nano))
	}
	at := t
	cons, err := st.CreateConsumer(ctx, jetstream.ConsumerConfig{
		AckPolicy: jetstream.AckNonePolicy, DeliverPolicy: jetstream.DeliverByStartTimePolicy, OptStartTime: &at,
		InactiveThreshold: 10 * time.Second, MemoryStorage: true, Replicas: 1,
	})
	if err != nil {
		return 0, fmt.Errorf("READINGS from %s: %w", t.Format(time.RFC3339Nano), err)
	}
	defer func() { _ = st.DeleteConsumer(context.WithoutCancel(ctx), cons.CachedInfo().Name) }()
	if cons.CachedInfo().NumPending == 0 {
		return 0, fmt.Errorf("%w: %s", ErrNoReadingAfter, t.Format(time.RFC3339Nano))
	}
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		return 0, fmt.Errorf("READINGS from %s: %w", t.Format(time.RFC3339Nano), err)
	}
	for m := range batch.Messages() {
		md, err := m.Metadata()
		if err != nil {
			return 0, fmt.Errorf("message metadata: %w", err)
		}
		return md.Sequence.Stream, nil
	}
	if err := batch.Error(); err != nil {
		return 0, fmt.Errorf("READINGS from %s: %w", t.Format(time.RFC3339Nano), err)
	}
	return 0, fmt.Errorf("%w: %s", ErrNoReadingAfter, t.Format(time.RFC3339Nano))
}
