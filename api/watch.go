package api

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	locksv1 "github.com/lock-sensors/lock-sensors/proto/locks/v1"
)

// The watch (WatchClientEvents): a client's feed, streamed live. A watcher reads from its
// cursor as the pull feed does, until the process's feed hub (feedhub.go) hands it the new
// rows of its client; it sends those. So a watch is exactly the pull feed read on: the same
// order, the same cursors, resumable on any instance.

// watchOpenHeader is the header a watch sends once open (REST then answers 200 at once).
const watchOpenHeader = "locks-watch-open"

// watchBatch is how many events a watcher reads from the database, or sends, at a time.
const watchBatch = 500

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
	// Subscribed before the first read: the hub lists it from its next query on.
	w := f.s.hub.subscribe(req.GetClientId())
	defer f.s.hub.unsubscribe(w)
	if err := stream.SendHeader(metadata.Pairs(watchOpenHeader, "1")); err != nil {
		return err
	}
	send := func(items []feedItem) error {
		for len(items) > 0 {
			n := min(len(items), watchBatch)
			if err := sendBatch(ctx, stream, items[:n], f.s.watchSendTimeout()); err != nil {
				return err
			}
			pos, items = items[n-1].pos, items[n:]
		}
		return nil
	}
	for {
		from, queued := f.s.hub.state(w, pos)
		var items []feedItem
		switch {
		case from == nil:
			// Not listed by the hub yet: read on up to the horizon, as a feed page does.
			if items, err = f.read(ctx, func(ctx context.Context) ([]feedItem, error) {
				return readFeed(ctx, f.s.db, req.GetClientId(), pos, nil, watchBatch)
			}); err != nil {
				return err
			}
		case pos.less(*from):
			// What lies before the hub's rows: final rows, read up to from.
			if items, err = f.read(ctx, func(ctx context.Context) ([]feedItem, error) {
				return readFeed(ctx, f.s.db, req.GetClientId(), pos, from, watchBatch)
			}); err != nil {
				return err
			}
			if len(items) < watchBatch {
				if err := send(items); err != nil {
					return err
				}
				pos = *from // all up to from is sent
				continue
			}
		default:
			for len(queued) > 0 && !pos.less(queued[0].pos) {
				queued = queued[1:] // sent already, read from the database
			}
			items = queued
		}
		if err := send(items); err != nil {
			return err
		}
		if len(items) == watchBatch && from == nil {
			continue // more may be there already
		}
		if len(items) > 0 && from != nil {
			continue // the queue may have grown meanwhile
		}
		select {
		case <-ctx.Done():
			return nil
		case <-w.wake:
		}
	}
}

// read runs a feed read under a call timeout of its own (a watch has none).
func (f *feedService) read(ctx context.Context, q func(context.Context) ([]feedItem, error)) ([]feedItem, error) {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	items, err := q(ctx)
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
