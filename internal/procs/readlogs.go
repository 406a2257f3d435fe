package procs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/lock-sensors/lock-sensors/internal/backoff"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
)

// LastLogs reads the newest n records of LOGS, oldest first, with an ordered consumer that
// starts n messages before the end (LOGS keeps at most natsx.LogsMaxMsgs).
func LastLogs(ctx context.Context, js jetstream.JetStream, n int) ([]LogRecord, error) {
	s, err := js.Stream(ctx, natsx.LogsStream)
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", natsx.LogsStream, err)
	}
	st := s.CachedInfo().State
	if st.Msgs == 0 || n <= 0 {
		return nil, nil
	}
	start := st.FirstSeq
	if st.LastSeq >= uint64(n) && st.LastSeq-uint64(n)+1 > start {
		start = st.LastSeq - uint64(n) + 1
	}
	c, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: start})
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", natsx.LogsStream, err)
	}
	out := make([]LogRecord, 0, min(n, int(st.Msgs)))
	for len(out) < n {
		batch, err := c.FetchNoWait(min(n-len(out), 500))
		if err != nil {
			return out, fmt.Errorf("stream %s: %w", natsx.LogsStream, err)
		}
		got := 0
		for m := range batch.Messages() {
			got++
			var r LogRecord
			if json.Unmarshal(m.Data(), &r) == nil {
				out = append(out, r)
			}
			if md, err := m.Metadata(); err == nil && md.Sequence.Stream >= st.LastSeq {
				return out, nil
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
			return out, fmt.Errorf("stream %s: %w", natsx.LogsStream, err)
		}
		if got == 0 {
			// Nothing yet: the consumer may still be starting; give it a moment, bounded by ctx.
			if !backoff.Sleep(ctx, 20*time.Millisecond) {
				return out, ctx.Err()
			}
		}
	}
	return out, nil
}
