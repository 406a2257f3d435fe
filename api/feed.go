package api

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"

	"github.com/lock-sensors/lock-sensors/internal/event"
	locksv1 "github.com/lock-sensors/lock-sensors/proto/locks/v1"
)

// A client's event feed (GET /v1/clients/{id}/events): its rows of notifier_deliveries, one
// per event its subscriptions and event types selected, whatever became of the delivery, in
// the order the notifier took them in: by (ingest_xid, id), the inserting transaction and
// the row. The notifier takes a sensor's events in revision order, one transaction after
// the other, so that order keeps each sensor's revisions in order.
//
// A row is served only once every transaction with a smaller id that could still write one has
// ended (ingest_xid below FeedHorizon): a transaction that began earlier and commits later
// would otherwise add rows behind a cursor already handed out, and a reader resuming from it
// would miss them. The price is that an open write transaction of this database holds the feed
// back until it ends. A (transaction, row) pair never changes, so a cursor means the same on
// every instance and after a restart. Rows leave with the notifier's retention
// (LOCKS_NOTIFIER_RETENTION); a cursor older than that resumes at the oldest row kept.

// FeedHorizon is an SQL expression (xid8): every transaction with a smaller id that could
// write a row of this database has ended, and its rows are in the statement's snapshot.
//
// It is the snapshot's smallest running transaction (pg_snapshot_xmin), leaving out those known
// to run in another database of the server: transaction ids are the server's, so another
// database's transactions (a migration, a DROP DATABASE, another application's batch job)
// would otherwise hold this feed back, and they cannot write here. A transaction is known to
// run in another database when pg_stat_activity shows it there (every role sees datid and
// backend_xid); that is a fact about the transaction that never changes, so it holds however
// late pg_stat_activity is read. One it does not show (it ended meanwhile, a prepared
// transaction) is waited for as one of this database. With none running, it is the snapshot's
// xmax, below which every transaction not running has ended. So a row below it is final and
// in the statement's snapshot: its transaction ended before the snapshot was taken, or runs in
// another database and wrote no row here.
const FeedHorizon = `(SELECT coalesce(min(x), pg_snapshot_xmax(pg_current_snapshot()))
	FROM pg_snapshot_xip(pg_current_snapshot()) x
	WHERE NOT EXISTS (SELECT 1 FROM pg_stat_activity a
		WHERE a.backend_xid = x::xid AND a.datid <> (SELECT oid FROM pg_database WHERE datname = current_database())))`

// cursorVersion is the first byte of a cursor, so that its layout can change.
const cursorVersion = 1

// feedPos is a position in a client's feed: after the row (xid, id).
type feedPos struct {
	xid uint64
	id  int64
}

func (p feedPos) cursor() string {
	var b [17]byte
	b[0] = cursorVersion
	binary.BigEndian.PutUint64(b[1:9], p.xid)
	binary.BigEndian.PutUint64(b[9:], uint64(p.id))
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// parseCursor reads a cursor; "" is the feed's start.
func parseCursor(field, c string) (feedPos, error) {
	if c == "" {
		return feedPos{}, nil
	}
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil || len(b) != 17 || b[0] != cursorVersion {
		return feedPos{}, fieldErr(field, "not a cursor of this feed: pass an item's cursor or a next_cursor unchanged")
	}
	return feedPos{xid: binary.BigEndian.Uint64(b[1:9]), id: int64(binary.BigEndian.Uint64(b[9:]))}, nil
}

type feedService struct {
	locksv1.UnimplementedClientEventServiceServer
	s *Server
}

// feedItem is one row of the feed.
type feedItem struct {
	pos  feedPos
	body []byte // the webhook body
}

func (f *feedService) ListClientEvents(ctx context.Context, req *locksv1.ListClientEventsRequest) (*locksv1.ListClientEventsResponse, error) {
	if err := checkClientID("client_id", req.GetClientId()); err != nil {
		return nil, err
	}
	after, err := parseCursor("after", req.GetAfter())
	if err != nil {
		return nil, err
	}
	n, err := pageSize(req.GetPageSize())
	if err != nil {
		return nil, err
	}
	var exists bool
	if err := f.s.db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM clients WHERE id = $1)`, req.GetClientId()).Scan(&exists); err != nil {
		return nil, fmt.Errorf("read client: %w", err)
	}
	if !exists {
		return nil, &NotFoundError{Kind: "client", ID: req.GetClientId()}
	}
	items, err := readFeed(ctx, f.s.db, req.GetClientId(), after, nil, n)
	if err != nil {
		return nil, err
	}
	out := &locksv1.ListClientEventsResponse{Events: make([]*locksv1.ClientEventItem, 0, len(items)), NextCursor: req.GetAfter()}
	for _, it := range items {
		c := it.pos.cursor()
		out.Events = append(out.Events, &locksv1.ClientEventItem{Cursor: c, Event: it.body})
		out.NextCursor = c
	}
	return out, nil
}

// readFeed reads up to n items of client's feed after pos: up to the horizon, or, with upto,
// up to that position, one below a horizon read earlier (the rows up to it are final).
func readFeed(ctx context.Context, db DB, client string, after feedPos, upto *feedPos, n int) ([]feedItem, error) {
	args := []any{client, strconv.FormatUint(after.xid, 10), after.id, n}
	bound := `d.ingest_xid < ` + FeedHorizon
	if upto != nil {
		bound = `(d.ingest_xid, d.id) <= ($5::text::xid8, $6)`
		args = append(args, strconv.FormatUint(upto.xid, 10), upto.id)
	}
	// The sensor's address is read now, as the notifier reads it at each attempt.
	return scanFeed(db.Query(ctx, `
		SELECT d.ingest_xid::text, d.id, d.payload, coalesce(s.address, '')
		FROM notifier_deliveries d
		LEFT JOIN sensors s ON s.id = d.sensor_id
		WHERE d.client_id = $1
		  AND (d.ingest_xid, d.id) > ($2::text::xid8, $3)
		  AND `+bound+`
		ORDER BY d.ingest_xid, d.id
		LIMIT $4`, args...))
}

// scanFeed reads the items of a feed query: (ingest_xid, id, payload, address) rows.
func scanFeed(rows pgx.Rows, err error) ([]feedItem, error) {
	if err != nil {
		return nil, fmt.Errorf("read event feed: %w", err)
	}
	defer rows.Close()
	var out []feedItem
	for rows.Next() {
		var xid string
		var it feedItem
		var payload []byte
		var address string
		if err := rows.Scan(&xid, &it.pos.id, &payload, &address); err != nil {
			return nil, fmt.Errorf("read event feed: %w", err)
		}
		if it.pos.xid, err = strconv.ParseUint(xid, 10, 64); err != nil {
			return nil, fmt.Errorf("read event feed: ingest_xid %q: %w", xid, err)
		}
		if it.body, err = feedBody(it.pos, payload, address); err != nil {
			return nil, err
		}
		out = append(out, it)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read event feed: %w", err)
	}
	return out, nil
}

// feedBody is the webhook body of the delivery row at pos.
func feedBody(pos feedPos, payload []byte, address string) ([]byte, error) {
	e, err := event.DecodeEvent(payload)
	if err != nil {
		return nil, fmt.Errorf("read event feed: row %d: %w", pos.id, err)
	}
	body, err := event.WebhookBody(e, address)
	if err != nil {
		return nil, fmt.Errorf("read event feed: row %d: %w", pos.id, err)
	}
	return body, nil
}

// feedJSON is the REST form of a feed page: each event as the JSON object it is (the proto
// carries it as bytes, which JSON would show as base64).
func feedJSON(r *locksv1.ListClientEventsResponse) ([]byte, error) {
	type item struct {
		Cursor string          `json:"cursor"`
		Event  json.RawMessage `json:"event"`
	}
	out := struct {
		Events     []item `json:"events"`
		NextCursor string `json:"next_cursor"`
	}{Events: make([]item, 0, len(r.GetEvents())), NextCursor: r.GetNextCursor()}
	for _, e := range r.GetEvents() {
		if !json.Valid(e.GetEvent()) {
			return nil, fmt.Errorf("event feed: an event is not JSON")
		}
		out.Events = append(out.Events, item{Cursor: e.GetCursor(), Event: e.GetEvent()})
	}
	return json.Marshal(out)
}

// watchJSON is one line of the REST event watch: {"cursor", "event"}, as a feed page's items.
func watchJSON(r *locksv1.WatchClientEventsResponse) ([]byte, error) {
	if !json.Valid(r.GetEvent()) {
		return nil, fmt.Errorf("event watch: an event is not JSON")
	}
	return json.Marshal(struct {
		Cursor string          `json:"cursor"`
		Event  json.RawMessage `json:"event"`
	}{r.GetCursor(), r.GetEvent()})
}
