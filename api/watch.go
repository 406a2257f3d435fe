package api

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	locksv1 "github.com/lock-sensors/lock-sensors/proto/locks/v1"
)

// The watch (WatchClientEvents): a client's feed, streamed live. One hub per API process
// polls Postgres for the clients whose feed grew, one query per poll whatever the number of
// watchers, and wakes only their watchers; a woken watcher reads its feed from its own
// cursor (readFeed, the pull feed's query) and sends what it finds. So a watch is exactly the
// pull feed read on: the same order, the same cursors, resumable on any instance.
//
// The hub's query finds the rows of the transactions that ended since its last poll: every
// transaction below the previous poll's xmin had ended then and its rows were announced; the
// ones between that xmin and the current one have ended since. A row is thus announced once,
// when the feed can first show it.

// watchOpenHeader is the header a watch sends once open (REST then answers 200 at once).
const watchOpenHeader = "locks-watch-open"

const (
	// watchPoll is how often the hub looks for new rows: a new event reaches a watcher within
	// about this, plus the time to read and send it.
	watchPoll = 100 * time.Millisecond
	// watchBatch is how many events a watcher reads and sends at a time.
	watchBatch = 500
	// watchIdle is how often an idle watcher reads its feed anyway, should a wake-up be lost
	// (a hub poll failing while Postgres restarts, say).
	watchIdle = 5 * time.Second
)

// feedHub wakes the watchers of clients whose feed grew.
type feedHub struct {
	db  DB
	log *slog.Logger

	mu       sync.Mutex
	watchers map[string]map[chan struct{}]struct{} // client → wake channels (buffered 1)
	xmin     string                                // the horizon of the last poll ("" before the first)
}

func newFeedHub(db DB, log *slog.Logger) *feedHub {
	return &feedHub{db: db, log: log, watchers: map[string]map[chan struct{}]struct{}{}}
}

// subscribe registers a watcher of client; cancel removes it.
func (h *feedHub) subscribe(client string) (wake chan struct{}, cancel func()) {
	wake = make(chan struct{}, 1)
	h.mu.Lock()
	if h.watchers[client] == nil {
		h.watchers[client] = map[chan struct{}]struct{}{}
	}
	h.watchers[client][wake] = struct{}{}
	h.mu.Unlock()
	return wake, func() {
		h.mu.Lock()
		delete(h.watchers[client], wake)
		if len(h.watchers[client]) == 0 {
			delete(h.watchers, client)
		}
		h.mu.Unlock()
	}
}

// run polls until ctx is done.
func (h *feedHub) run(ctx context.Context) {
	t := time.NewTicker(watchPoll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := h.poll(ctx); err != nil && ctx.Err() == nil {
			h.log.WarnContext(ctx, "event watch: poll for new events failed; watchers read their feed every "+watchIdle.String()+" meanwhile", "err", err)
		}
	}
}

func (h *feedHub) poll(ctx context.Context) error {
	h.mu.Lock()
	prev, idle := h.xmin, len(h.watchers) == 0
	h.mu.Unlock()
	var xmin string
	var clients []string
	if prev == "" || idle {
		// Nobody to wake: only move the horizon.
		if err := h.db.QueryRow(ctx, `SELECT pg_snapshot_xmin(pg_current_snapshot())::text`).Scan(&xmin); err != nil {
			return fmt.Errorf("read horizon: %w", err)
		}
	} else {
		if err := h.db.QueryRow(ctx, `
			SELECT pg_snapshot_xmin(pg_current_snapshot())::text,
			       ARRAY(SELECT DISTINCT client_id FROM notifier_deliveries
			             WHERE ingest_xid >= $1::text::xid8 AND ingest_xid < pg_snapshot_xmin(pg_current_snapshot()))`,
			prev).Scan(&xmin, &clients); err != nil {
			return fmt.Errorf("read clients with new events: %w", err)
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.xmin = xmin
	for _, c := range clients {
		for w := range h.watchers[c] {
			select {
			case w <- struct{}{}:
			default: // already woken
			}
		}
	}
	return nil
}

func (f *feedService) WatchClientEvents(req *locksv1.WatchClientEventsRequest, stream locksv1.ClientEventService_WatchClientEventsServer) error {
	ctx := stream.Context()
	if err := checkClientID("client_id", req.GetClientId()); err != nil {
		return err
	}
	pos, err := parseCursor("after", req.GetAfter())
	if err != nil {
		return err
	}
	var exists bool
	if err := f.s.db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM clients WHERE id = $1)`, req.GetClientId()).Scan(&exists); err != nil {
		return fmt.Errorf("read client: %w", err)
	}
	if !exists {
		return &NotFoundError{Kind: "client", ID: req.GetClientId()}
	}
	// Subscribed before the first read: an event committed between that read and the wait
	// still wakes it.
	wake, cancel := f.s.hub.subscribe(req.GetClientId())
	defer cancel()
	if err := stream.SendHeader(metadata.Pairs(watchOpenHeader, "1")); err != nil {
		return err
	}
	idle := time.NewTimer(watchIdle)
	defer idle.Stop()
	for {
		items, err := f.read(ctx, req.GetClientId(), pos)
		if err != nil {
			return err
		}
		if len(items) > 0 {
			if err := sendBatch(ctx, stream, items, f.s.watchSendTimeout()); err != nil {
				return err
			}
			pos = items[len(items)-1].pos
			if len(items) == watchBatch {
				continue // more may be there already
			}
		}
		idle.Reset(watchIdle)
		select {
		case <-ctx.Done():
			return nil
		case <-wake:
		case <-idle.C:
		}
	}
}

// read is readFeed under a call timeout of its own (a watch has none).
func (f *feedService) read(ctx context.Context, client string, pos feedPos) ([]feedItem, error) {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	items, err := readFeed(ctx, f.s.db, client, pos, watchBatch)
	if err != nil && ctx.Err() != nil {
		return nil, status.Error(codes.Unavailable, "reading the event feed timed out; resume from the last cursor")
	}
	return items, err
}

// watchSendTimeout is how long a batch may take to leave: a watcher that reads slower is cut
// off (RESOURCE_EXHAUSTED) and resumes from its cursor, rather than be buffered for.
func (s *Server) watchSendTimeout() time.Duration {
	if s.cfg.WatchSendTimeout > 0 {
		return s.cfg.WatchSendTimeout
	}
	return WatchSendTimeoutDefault
}

// sendBatch sends items, or cuts the watcher off when they do not leave within timeout:
// gRPC's flow control holds them meanwhile, so nothing piles up beyond one batch per watcher.
// Returning ends the stream, which unblocks the send.
func sendBatch(ctx context.Context, stream locksv1.ClientEventService_WatchClientEventsServer, items []feedItem, timeout time.Duration) error {
	done := make(chan error, 1)
	go func() {
		for _, it := range items {
			if err := stream.Send(&locksv1.WatchClientEventsResponse{Cursor: it.pos.cursor(), Event: it.body}); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return nil
	case <-t.C:
		return status.Error(codes.ResourceExhausted, "this watcher reads slower than its events come: cut off after "+
			timeout.String()+" without taking a batch; resume from the cursor of the last event received")
	}
}
