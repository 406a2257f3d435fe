package api

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"
)

// The feed hub: one per API process, it reads the new delivery rows for every open watch. One
// query per poll, whatever the number of watchers, reads the rows below the horizon that it
// has not read yet, for the clients that have a watcher; each row is read and its webhook body
// built once, then queued for every watcher of its client. So a watch costs Postgres nothing
// per event, and an event reaches its watcher about a poll after its transaction ends.
//
// The hub's rows follow one another: each query reads on from the position where the last one
// stopped (done), in feed order, up to a horizon, below which every row is final. A watcher is
// listed in a query's client list from some query on; from then it is handed every row of its
// client after that query's starting position (the watcher's from), in order. What lies
// between its cursor and from it reads from the database itself (readFeed up to from): those rows
// are final, below a horizon read earlier. While the hub has not listed it yet, it reads on
// from its cursor up to the horizon (readFeed), as a feed page does, so that a resumed watch
// catches up at once. Items it already sent come again from the hub at most once more, and
// are skipped by position.
//
// A watcher whose queue is full (it sends slower than its events come) is taken off the list
// and its queue dropped: it reads from the database again, from where it is, up to the
// position of the next query that lists it. Nothing is buffered for it without bound, and a
// watcher that cannot take what it is sent at all is cut off by sendBatch.

const (
	// hubPoll is how often the hub looks for new rows: part of an event's way to its watcher.
	hubPoll = 50 * time.Millisecond
	// hubIdlePoll is how often it moves on to the horizon while nobody watches, so that the
	// first query after a watch opens does not read from far back. A watch that opens makes
	// it look at once.
	hubIdlePoll = time.Second
	// hubBatch is the most rows one hub query reads; a full one is followed by the next at once.
	hubBatch = 2000
	// watchQueue is the most items queued for one watcher; past it, the watcher reads from
	// the database instead.
	watchQueue = 2 * watchBatch
)

// feedHub hands new feed rows to the watchers of their clients.
type feedHub struct {
	db    DB
	log   *slog.Logger
	queue int           // watchQueue; smaller in tests
	kick  chan struct{} // buffered 1: a watch opened, look now

	mu       sync.Mutex
	watchers map[string]map[*watcher]struct{} // by client
	done     feedPos                          // every row up to here (feed order) was handed out
	started  bool                             // done was set by a first poll
	handed   int                              // items queued for watchers (tests)
	resyncs  int                              // watchers sent back to the database (tests)
}

// watcher is one open watch, as the hub sees it.
type watcher struct {
	client string
	wake   chan struct{} // buffered 1: the hub set from or queued items

	// Under the hub's mu:
	listed  bool       // in the client list of the query under way, or of the last ones
	pending feedPos    // the position that query reads after
	from    *feedPos   // the hub hands this watcher every row of its client after from (nil: not yet)
	items   []feedItem // queued, in feed order, all after from
}

func newFeedHub(db DB, log *slog.Logger) *feedHub {
	return &feedHub{db: db, log: log, queue: watchQueue, kick: make(chan struct{}, 1), watchers: map[string]map[*watcher]struct{}{}}
}

// subscribe registers a watcher of client; unsubscribe removes it.
func (h *feedHub) subscribe(client string) *watcher {
	w := &watcher{client: client, wake: make(chan struct{}, 1)}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.watchers[client] == nil {
		h.watchers[client] = map[*watcher]struct{}{}
	}
	h.watchers[client][w] = struct{}{}
	poke(h.kick)
	return w
}

func (h *feedHub) unsubscribe(w *watcher) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.watchers[w.client], w)
	if len(h.watchers[w.client]) == 0 {
		delete(h.watchers, w.client)
	}
}

// state is what the hub has for w: from (nil while not listed), and, once pos is at or past
// from, the items queued, taken off the queue.
func (h *feedHub) state(w *watcher, pos feedPos) (from *feedPos, items []feedItem) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if w.from == nil {
		return nil, nil
	}
	f := *w.from
	if pos.less(f) {
		return &f, nil
	}
	items, w.items = w.items, nil
	return &f, items
}

// run polls until ctx is done.
func (h *feedHub) run(ctx context.Context) {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		full, err := h.poll(ctx)
		if err != nil && ctx.Err() == nil {
			h.log.WarnContext(ctx, "event watch: poll for new events failed; retrying", "err", err)
		}
		if full && err == nil {
			continue // more are there already
		}
		h.mu.Lock()
		wait := hubPoll
		if len(h.watchers) == 0 {
			wait = hubIdlePoll
		}
		h.mu.Unlock()
		t.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-h.kick:
		}
	}
}

// hubRow is one row a hub query read.
type hubRow struct {
	client string
	item   feedItem
}

// poll reads the next rows and hands them out; full says the query read all it may at once.
func (h *feedHub) poll(ctx context.Context) (full bool, err error) {
	h.mu.Lock()
	if !h.started || len(h.watchers) == 0 {
		// Nobody to hand rows to: only move on to the horizon.
		h.mu.Unlock()
		var x string
		if err := h.db.QueryRow(ctx, `SELECT `+FeedHorizon+`::text`).Scan(&x); err != nil {
			return false, fmt.Errorf("read horizon: %w", err)
		}
		horizon, err := strconv.ParseUint(x, 10, 64)
		if err != nil {
			return false, fmt.Errorf("read horizon %q: %w", x, err)
		}
		h.mu.Lock()
		h.done, h.started = maxPos(h.done, feedPos{xid: horizon}), true
		h.mu.Unlock()
		return false, nil
	}
	after := h.done
	clients := make([]string, 0, len(h.watchers))
	for c, ws := range h.watchers {
		clients = append(clients, c)
		for w := range ws {
			if !w.listed {
				w.listed, w.pending = true, after
			}
		}
	}
	h.mu.Unlock()

	horizon, rows, err := h.read(ctx, after, clients)
	if err != nil {
		return false, err
	}

	h.mu.Lock()
	defer h.mu.Unlock()
	for _, ws := range h.watchers {
		for w := range ws {
			if w.listed && w.from == nil {
				f := w.pending
				w.from = &f
				poke(w.wake)
			}
		}
	}
	for _, r := range rows {
		for w := range h.watchers[r.client] {
			if !w.listed {
				continue // subscribed after the list was taken, or dropped in this round
			}
			if len(w.items) >= h.queue {
				// Slower than its events: it reads from the database again from where it is.
				w.listed, w.from, w.items = false, nil, nil
				h.resyncs++
				h.log.DebugContext(ctx, "event watch: a watcher's queue is full; it reads from the database", "client_id", r.client)
			} else {
				w.items = append(w.items, r.item)
				h.handed++
			}
			poke(w.wake)
		}
	}
	if len(rows) == hubBatch {
		h.done = rows[len(rows)-1].item.pos
		return true, nil
	}
	// Every row below the horizon after `after` of a listed client was read.
	h.done = maxPos(h.done, feedPos{xid: horizon})
	if len(rows) > 0 {
		h.done = maxPos(h.done, rows[len(rows)-1].item.pos)
	}
	return false, nil
}

// read is one hub query: the horizon, and up to hubBatch rows of clients after `after` below
// it, in feed order. The horizon and the rows are of one snapshot.
func (h *feedHub) read(ctx context.Context, after feedPos, clients []string) (horizon uint64, out []hubRow, err error) {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	rows, err := h.db.Query(ctx, `
		WITH h AS (SELECT `+FeedHorizon+` AS x)
		SELECT h.x::text, d.client_id, d.ingest_xid::text, d.id, d.payload, coalesce(s.address, '')
		FROM h
		LEFT JOIN LATERAL (
			SELECT d.client_id, d.ingest_xid, d.id, d.payload, d.sensor_id
			FROM notifier_deliveries d
			WHERE d.ingest_xid >= $1::text::xid8 AND (d.ingest_xid, d.id) > ($1::text::xid8, $2)
			  AND d.ingest_xid < h.x AND d.client_id = ANY($3::text[])
			ORDER BY d.ingest_xid, d.id
			LIMIT $4) d ON true
		LEFT JOIN sensors s ON s.id = d.sensor_id
		ORDER BY d.ingest_xid, d.id`,
		strconv.FormatUint(after.xid, 10), after.id, clients, hubBatch)
	if err != nil {
		return 0, nil, fmt.Errorf("read new events: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var x string
		var client, xid *string
		var id *int64
		var payload []byte
		var address string
		if err := rows.Scan(&x, &client, &xid, &id, &payload, &address); err != nil {
			return 0, nil, fmt.Errorf("read new events: %w", err)
		}
		if horizon, err = strconv.ParseUint(x, 10, 64); err != nil {
			return 0, nil, fmt.Errorf("read new events: horizon %q: %w", x, err)
		}
		if client == nil {
			continue // no row: the horizon alone
		}
		r := hubRow{client: *client, item: feedItem{pos: feedPos{id: *id}}}
		if r.item.pos.xid, err = strconv.ParseUint(*xid, 10, 64); err != nil {
			return 0, nil, fmt.Errorf("read new events: ingest_xid %q: %w", *xid, err)
		}
		if r.item.body, err = feedBody(r.item.pos, payload, address); err != nil {
			return 0, nil, err
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return 0, nil, fmt.Errorf("read new events: %w", err)
	}
	return horizon, out, nil
}

// less orders positions as the feed does.
func (p feedPos) less(q feedPos) bool {
	return p.xid < q.xid || p.xid == q.xid && p.id < q.id
}

func maxPos(p, q feedPos) feedPos {
	if p.less(q) {
		return q
	}
	return p
}

// poke wakes a watcher without blocking: one wake-up waiting is enough.
func poke(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}
