package history

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/lock-sensors/lock-sensors/internal/backoff"
	"github.com/lock-sensors/lock-sensors/internal/chschema"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
)

// The history projector's consumers live in memory only (the server rewrites the state file
// of a file-backed consumer up to ten times a second, each write synced): where each one
// resumes is kept in ClickHouse (chschema.Positions), beside the rows. Each sink writes the
// positions of the sources in a batch in one small INSERT after the batch's rows, so a
// position is never ahead of what is written; at worst it is behind, and the tail after it
// is written again, which the ReplacingMergeTree tables collapse (their keys hold the stream
// sequence and the receive time). The positions are read once at start; a consumer recreated
// while the process runs (a break in its run, NATS restarted and the memory consumer gone)
// resumes right after the last message handed to the sink, once the sink has written all it
// was handed.
//
// A position names the stream it was written on (its creation time, which JetStream keeps
// across restarts and restores from a backup). One of another stream (the NATS store lost or
// replaced while ClickHouse was kept) or ahead of its stream's last message (a store restored
// from an older copy, or one that lost its last writes) is dropped, loudly, and its consumer
// starts at the stream's first message: unlike the state projector, which refuses such a
// checkpoint because it folds readings into state and would fold the new stream onto the old
// one, history only copies messages, keyed so that a message of the new stream never
// collapses into a row of the old one, and copying a message again collapses into its row. So
// starting over loses nothing, doubles nothing, and needs no operator. A position before the
// stream's first message (the stream's limits removed what history had not written) starts
// at the first message, with a warning naming what history never got.

// position is where a source resumes: every message of the source up to seq, in the stream
// whose identity is stream, is written.
type position struct {
	stream string
	seq    uint64
}

// streamNow asks the server for stream's identity and extent.
func streamNow(ctx context.Context, js jetstream.JetStream, stream string) (natsx.Extent, error) {
	st, err := natsx.Stream(ctx, js, stream)
	if err != nil {
		return natsx.Extent{}, fmt.Errorf("%s info: %w", stream, err)
	}
	info := st.CachedInfo()
	return natsx.ExtentOf(info), nil
}

// Why a source does not resume right after its position.
const (
	resetOtherStream = "other_stream" // written on another stream: started over
	resetAhead       = "ahead"        // ahead of the stream's last message: started over
	resetTruncated   = "truncated"    // before the stream's first message: started there
)

// startAt is the stream sequence a source at p reads next in s, and, when that is not right
// after p, why (one of the reset constants).
func startAt(p position, s natsx.Extent) (uint64, string) {
	first := max(s.First, 1)
	switch {
	case p.seq == 0:
		return first, ""
	case p.stream != s.ID:
		return first, resetOtherStream
	case p.seq > s.Last:
		return first, resetAhead
	case p.seq+1 < first:
		return first, resetTruncated
	}
	return p.seq + 1, ""
}

// explainReset is the log line's reason for a start at start after p in s.
func explainReset(why string, p position, s natsx.Extent, start uint64) string {
	switch why {
	case resetOtherStream:
		return fmt.Sprintf("position %d was written on the stream created %s, but the stream now is the one created %s (the NATS store was lost or replaced): reading the new stream from its first message, %d",
			p.seq, p.stream, s.ID, start)
	case resetAhead:
		return fmt.Sprintf("position %d is ahead of the stream's last message %d (the store was restored from an older copy or lost its last writes): reading it again from its first message, %d; what is written already collapses",
			p.seq, s.Last, start)
	default:
		return fmt.Sprintf("position %d is before the stream's first message %d: the stream's messages %d to %d were removed (its limits, or a purge) before history wrote those of this consumer",
			p.seq, s.First, p.seq+1, s.First-1)
	}
}

// readPositions reads the positions of sources (consumer names); a source with none is absent.
func readPositions(ctx context.Context, ch driver.Conn, sources []string) (map[string]position, error) {
	rows, err := ch.Query(ctx, `SELECT source, argMax(stream, written), argMax(seq, written) FROM `+
		chschema.Positions.Name+` WHERE has(?, source) GROUP BY source`, sources)
	if err != nil {
		return nil, fmt.Errorf("read history positions: %w", err)
	}
	defer rows.Close()
	out := map[string]position{}
	for rows.Next() {
		var src string
		var p position
		if err := rows.Scan(&src, &p.stream, &p.seq); err != nil {
			return nil, fmt.Errorf("read history positions: %w", err)
		}
		out[src] = p
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read history positions: %w", err)
	}
	return out, nil
}

// writePositions writes ps (by source) in one INSERT, stamped now: the newest row of a
// source is its position.
func writePositions(ctx context.Context, ch driver.Conn, ps map[string]position, now time.Time) error {
	t := chschema.Positions
	ctx, done := batchContext(ctx)
	defer done()
	b, err := ch.PrepareBatch(ctx, t.Insert(t.Name))
	if err != nil {
		return fmt.Errorf("prepare insert into %s: %w", t.Name, err)
	}
	for src, p := range ps {
		if err := b.Append(src, p.stream, p.seq, uint64(now.UnixNano())); err != nil {
			_ = b.Abort()
			return fmt.Errorf("insert into %s: %w", t.Name, err)
		}
	}
	if err := b.Send(); err != nil {
		return fmt.Errorf("insert into %s: %w", t.Name, err)
	}
	return nil
}

// loadPositions reads where srcs resume from ClickHouse, trying again until it can or ctx is
// done (false).
func (h *Projector) loadPositions(ctx context.Context, srcs []*source) bool {
	names := make([]string, len(srcs))
	for i, src := range srcs {
		names[i] = src.durable
	}
	retry := backoff.New(100*time.Millisecond, 5*time.Second)
	for {
		ps, err := readPositions(ctx, h.ch, names)
		if err == nil {
			for _, src := range srcs {
				src.pos = ps[src.durable]
			}
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		h.log.Warn("history: reading where the consumers resume; retrying", "err", err)
		retry.Wait(ctx)
	}
}

// startFrom is where src, at p, reads next in st; a start elsewhere than right after p is
// logged and counted.
func (h *Projector) startFrom(ctx context.Context, src *source, table string, p position, st natsx.Extent) uint64 {
	start, why := startAt(p, st)
	if why != "" {
		lvl := slog.LevelError
		if why == resetTruncated {
			lvl = slog.LevelWarn
		}
		h.log.Log(ctx, lvl, "history: a consumer does not resume at its position", "consumer", src.durable,
			"reason", explainReset(why, p, st, start))
		h.m.resets.WithLabelValues(table, why).Inc()
	}
	return start
}
