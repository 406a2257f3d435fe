// Package history answers questions about the past from ClickHouse: a sensor's readings and
// events, a client's webhook attempts, each in a time range with keyset paging, and per-interval
// statistics of a sensor (readings, state changes, time closed, open and lost).
//
// The tables are ReplacingMergeTree, written at least once by the history projector: a
// redelivered batch leaves duplicate rows until ClickHouse merges them. Every query here
// collapses duplicates itself (LIMIT 1 BY the row's key, uniqExact, GROUP BY), so a caller never
// sees one. Bad input is an *InvalidError naming the field (errors.Is(err, ErrInvalid)).
package history

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/lock-sensors/lock-sensors/internal/chschema"
)

// Paging limits (docs/contract.md section 3).
const (
	DefaultPageSize = 100
	MaxPageSize     = 1000
	// MaxIntervals bounds the intervals of one statistics query.
	MaxIntervals = 10_000
)

// ErrInvalid is matched by every error about the caller's input.
var ErrInvalid = errors.New("invalid history query")

// InvalidError says which request field is wrong and why.
type InvalidError struct {
	Field  string // request field name: start_time, end_time, page_size, page_token, interval, sensor_id, client_id
	Reason string
}

func (e *InvalidError) Error() string { return e.Field + ": " + e.Reason }

// Unwrap makes errors.Is(err, ErrInvalid) true.
func (e *InvalidError) Unwrap() error { return ErrInvalid }

func invalid(field, format string, a ...any) error {
	return &InvalidError{Field: field, Reason: fmt.Sprintf(format, a...)}
}

// Store runs the queries.
type Store struct {
	ch  driver.Conn
	now func() time.Time
}

// New returns a Store on a native ClickHouse connection to the history database.
func New(ch driver.Conn) (*Store, error) {
	if ch == nil {
		return nil, errors.New("history: nil ClickHouse connection")
	}
	return &Store{ch: ch, now: time.Now}, nil
}

// Query selects a page of a list. Start is inclusive and End exclusive (zero: unbounded) on
// the row's time: a reading's ts (or its receive time when it had none), an event's
// occurred_at, an attempt's time. Readings and events are listed in the order the system
// received them, not by that time: a sensor's clock may be years off (docs/contract.md section 1).
type Query struct {
	Start, End time.Time
	// PageSize is 1 to MaxPageSize; 0 means DefaultPageSize.
	PageSize int
	// PageToken is the NextPageToken of the previous page, "" for the first. It is valid only
	// with the same id, Start, End and NewestFirst.
	PageToken string
	// NewestFirst lists newest first; the default is oldest first.
	NewestFirst bool
}

// Reading is one recorded reading.
type Reading struct {
	SensorID     string
	Data         uint8
	Time         time.Time // the sensor's ts, or ReceivedTime when it sent none
	ReceivedTime time.Time
	Seq          uint64 // READINGS stream sequence
	MessageID    string
}

// ReadingsPage is one page of readings; NextPageToken is "" on the last page.
type ReadingsPage struct {
	Readings      []Reading
	NextPageToken string
}

// Event is one sensor event (state_changed, connection_lost, connection_restored).
type Event struct {
	ID           string
	SensorID     string
	Type         string
	Time         time.Time // occurred_at: a state change's reading time, which may be the sensor's clock
	Data         uint8
	PreviousData *uint8
	Revision     int64
	// ReceivedTime is when EVENTS stored the event (server time); lists are in its order.
	ReceivedTime time.Time
}

// EventsPage is one page of events.
type EventsPage struct {
	Events        []Event
	NextPageToken string
}

// Delivery is one webhook attempt.
type Delivery struct {
	EventID    string
	ClientID   string
	SensorID   string
	Attempt    int
	Time       time.Time
	StatusCode int // 0 when no response came
	Latency    time.Duration
	Error      string
	Outcome    string // delivered, retry, dead, cancelled, superseded
}

// DeliveriesPage is one page of attempts.
type DeliveriesPage struct {
	Deliveries    []Delivery
	NextPageToken string
}

// window is a validated query in milliseconds since 1970 (end exclusive).
type window struct {
	start, end int64
	size       int
	newest     bool
	after      *pageToken
	fp         string // fingerprint of the list, id and range, which tokens carry
}

// DateTime's range; times outside are clamped, never errors: "since 1900" means "since ever".
const maxMS = int64(4294967295) * 1000

func clampMS(t time.Time) int64 {
	return min(max(t.UnixMilli(), 0), maxMS)
}

func checkID(field, id string) error {
	if id == "" {
		return invalid(field, "required")
	}
	if len(id) > 256 {
		return invalid(field, "longer than 256 characters")
	}
	return nil
}

func (q Query) window(kind, id string) (window, error) {
	w := window{start: 0, end: maxMS + 1000, newest: q.NewestFirst}
	if !q.Start.IsZero() {
		w.start = clampMS(q.Start)
	}
	if !q.End.IsZero() {
		if !q.Start.IsZero() && !q.End.After(q.Start) {
			return w, invalid("end_time", "must be after start_time (%s), got %s",
				q.Start.UTC().Format(time.RFC3339Nano), q.End.UTC().Format(time.RFC3339Nano))
		}
		w.end = clampMS(q.End)
	}
	switch {
	case q.PageSize == 0:
		w.size = DefaultPageSize
	case q.PageSize < 0 || q.PageSize > MaxPageSize:
		return w, invalid("page_size", "must be between 1 and %d, got %d", MaxPageSize, q.PageSize)
	default:
		w.size = q.PageSize
	}
	w.fp = fingerprint(kind, id, w)
	if q.PageToken != "" {
		tok, err := decodePageToken(q.PageToken)
		if err != nil {
			return w, err
		}
		if tok.Q != w.fp {
			return w, invalid("page_token", "belongs to another query (id, start_time, end_time and order must stay the same)")
		}
		w.after = &tok
	}
	return w, nil
}

// tmsExpr is a row's time in milliseconds.
const tmsExpr = "(toInt64(time) * 1000 + time_ms)"

// A list's order: the time columns it is sorted and paged by (the table's sorting key after
// the id), the row's time for deliveries, the receive time for readings and events.
type orderCols struct{ sec, expr string }

var (
	byTime     = orderCols{"time", tmsExpr}
	byReceived = orderCols{"received", "(toInt64(received) * 1000 + received_ms)"}
)

// rangeConds are the WHERE conditions of w on the time columns, with coarse ones on the
// DateTime column so that the primary key prunes where time is in it (deliveries; readings and
// events are sorted by receive time, and a sensor's clock says nothing about that).
func (w window) rangeConds() []string {
	c := []string{
		fmt.Sprintf("time >= toDateTime(%d)", w.start/1000),
		fmt.Sprintf("%s >= %d", tmsExpr, w.start),
		fmt.Sprintf("%s < %d", tmsExpr, w.end),
	}
	if w.end <= maxMS {
		c = append(c, fmt.Sprintf("time <= toDateTime(%d)", (w.end-1)/1000))
	}
	return c
}

// keysetCond continues after the token's row: rows strictly after (or before, newest first)
// (T, tie) in the list's order. tie gives the tie-breaking condition for a comparison operator.
func (w window) keysetCond(by orderCols, tie func(op string) string) string {
	t, op, bound := w.after.T, ">", ">="
	if w.newest {
		op, bound = "<", "<="
	}
	return fmt.Sprintf("%s %s toDateTime(%d) AND (%s %s %d OR (%s = %d AND %s))",
		by.sec, bound, t/1000, by.expr, op, t, by.expr, t, tie(op))
}

func (w window) order(cols ...string) string {
	dir := ""
	if w.newest {
		dir = " DESC"
	}
	return strings.Join(cols, dir+", ") + dir
}

func msTime(sec uint32, ms uint16) time.Time {
	return time.UnixMilli(int64(sec)*1000 + int64(ms)).UTC()
}

// The columns each list scans, in its Scan order, checked against the table definitions when
// the package is loaded.
var (
	readingsCols   = chschema.Readings.Select("seq", "data", "toUInt32(time)", "time_ms", "toUInt32(received)", "received_ms", "message_id")
	eventsCols     = chschema.Events.Select("event_id", "type", "toUInt32(time)", "time_ms", "data", "previous_data", "revision", "toUInt32(received)", "received_ms")
	deliveriesCols = chschema.Deliveries.Select("event_id", "sensor_id", "attempt", "toUInt32(time)", "time_ms", "status_code", "latency_ms", "error", "outcome")
)

// Readings lists a sensor's readings.
func (s *Store) Readings(ctx context.Context, sensorID string, q Query) (ReadingsPage, error) {
	var page ReadingsPage
	if err := checkID("sensor_id", sensorID); err != nil {
		return page, err
	}
	// Tokens of the lists ordered by ts, before the receive-time order, are refused as another query's.
	w, err := q.window("readings.received", sensorID)
	if err != nil {
		return page, err
	}
	conds := append([]string{"sensor_id = " + quote(sensorID)}, w.rangeConds()...)
	if w.after != nil {
		conds = append(conds, w.keysetCond(byReceived, func(op string) string { return fmt.Sprintf("seq %s %d", op, w.after.S) }))
	}
	sql := "SELECT " + readingsCols + " FROM " + chschema.Readings.Name + " WHERE " +
		strings.Join(conds, " AND ") + " ORDER BY " + w.order("received", "received_ms", "seq") +
		// A reading is its sequence in the stream it came from: after a store loss the new
		// READINGS numbers from 1 again, and its readings differ from the old ones of the
		// same sequence by their receive time.
		" LIMIT 1 BY received, received_ms, seq LIMIT " + strconv.Itoa(w.size+1)
	rows, err := s.ch.Query(ctx, sql)
	if err != nil {
		return page, fmt.Errorf("history: readings of %s: %w", sensorID, err)
	}
	defer rows.Close()
	for rows.Next() {
		var r Reading
		var ts, rs uint32
		var tms, rms uint16
		if err := rows.Scan(&r.Seq, &r.Data, &ts, &tms, &rs, &rms, &r.MessageID); err != nil {
			return page, fmt.Errorf("history: readings of %s: %w", sensorID, err)
		}
		r.SensorID, r.Time, r.ReceivedTime = sensorID, msTime(ts, tms), msTime(rs, rms)
		page.Readings = append(page.Readings, r)
	}
	if err := rows.Err(); err != nil {
		return page, fmt.Errorf("history: readings of %s: %w", sensorID, err)
	}
	if len(page.Readings) > w.size {
		page.Readings = page.Readings[:w.size]
		last := page.Readings[w.size-1]
		page.NextPageToken = encodePageToken(pageToken{Q: w.fp, T: last.ReceivedTime.UnixMilli(), S: last.Seq})
	}
	return page, nil
}

// quoteEscaper escapes a ClickHouse string literal's backslashes and quotes.
var quoteEscaper = strings.NewReplacer(`\`, `\\`, `'`, `\'`)

// quote is a ClickHouse string literal.
func quote(s string) string {
	return "'" + quoteEscaper.Replace(s) + "'"
}

// Events lists a sensor's events.
func (s *Store) Events(ctx context.Context, sensorID string, q Query) (EventsPage, error) {
	var page EventsPage
	if err := checkID("sensor_id", sensorID); err != nil {
		return page, err
	}
	w, err := q.window("events.received", sensorID)
	if err != nil {
		return page, err
	}
	conds := append([]string{"sensor_id = " + quote(sensorID)}, w.rangeConds()...)
	if w.after != nil {
		// Several events of a sensor often share a millisecond (a restoring reading that also
		// changes the state): its revision orders them.
		conds = append(conds, w.keysetCond(byReceived, func(op string) string {
			return fmt.Sprintf("(revision %s %d OR (revision = %d AND event_id %s %s))", op, w.after.S, w.after.S, op, quote(w.after.ID))
		}))
	}
	sql := "SELECT " + eventsCols + " FROM " + chschema.Events.Name + " WHERE " +
		strings.Join(conds, " AND ") + " ORDER BY " + w.order("received", "received_ms", "revision", "event_id") +
		" LIMIT 1 BY event_id LIMIT " + strconv.Itoa(w.size+1)
	rows, err := s.ch.Query(ctx, sql)
	if err != nil {
		return page, fmt.Errorf("history: events of %s: %w", sensorID, err)
	}
	defer rows.Close()
	for rows.Next() {
		var e Event
		var ts, rs uint32
		var tms, rms uint16
		var rev uint64
		if err := rows.Scan(&e.ID, &e.Type, &ts, &tms, &e.Data, &e.PreviousData, &rev, &rs, &rms); err != nil {
			return page, fmt.Errorf("history: events of %s: %w", sensorID, err)
		}
		e.SensorID, e.Time, e.Revision, e.ReceivedTime = sensorID, msTime(ts, tms), int64(rev), msTime(rs, rms)
		page.Events = append(page.Events, e)
	}
	if err := rows.Err(); err != nil {
		return page, fmt.Errorf("history: events of %s: %w", sensorID, err)
	}
	if len(page.Events) > w.size {
		page.Events = page.Events[:w.size]
		last := page.Events[w.size-1]
		page.NextPageToken = encodePageToken(pageToken{Q: w.fp, T: last.ReceivedTime.UnixMilli(), S: uint64(last.Revision), ID: last.ID})
	}
	return page, nil
}

// Deliveries lists a client's webhook attempts.
func (s *Store) Deliveries(ctx context.Context, clientID string, q Query) (DeliveriesPage, error) {
	var page DeliveriesPage
	if err := checkID("client_id", clientID); err != nil {
		return page, err
	}
	w, err := q.window("deliveries", clientID)
	if err != nil {
		return page, err
	}
	conds := append([]string{"client_id = " + quote(clientID)}, w.rangeConds()...)
	if w.after != nil {
		id := quote(w.after.ID)
		conds = append(conds, w.keysetCond(byTime, func(op string) string {
			return fmt.Sprintf("(event_id %s %s OR (event_id = %s AND attempt %s %d))", op, id, id, op, w.after.S)
		}))
	}
	sql := "SELECT " + deliveriesCols + " FROM " + chschema.Deliveries.Name + " WHERE " +
		strings.Join(conds, " AND ") + " ORDER BY " + w.order("time", "time_ms", "event_id", "attempt") +
		" LIMIT 1 BY time, time_ms, event_id, attempt LIMIT " + strconv.Itoa(w.size+1)
	rows, err := s.ch.Query(ctx, sql)
	if err != nil {
		return page, fmt.Errorf("history: deliveries of %s: %w", clientID, err)
	}
	defer rows.Close()
	for rows.Next() {
		var d Delivery
		var ts uint32
		var tms, att, st uint16
		var lat uint32
		if err := rows.Scan(&d.EventID, &d.SensorID, &att, &ts, &tms, &st, &lat, &d.Error, &d.Outcome); err != nil {
			return page, fmt.Errorf("history: deliveries of %s: %w", clientID, err)
		}
		d.ClientID, d.Attempt, d.Time, d.StatusCode, d.Latency = clientID, int(att), msTime(ts, tms), int(st), time.Duration(lat)*time.Millisecond
		page.Deliveries = append(page.Deliveries, d)
	}
	if err := rows.Err(); err != nil {
		return page, fmt.Errorf("history: deliveries of %s: %w", clientID, err)
	}
	if len(page.Deliveries) > w.size {
		page.Deliveries = page.Deliveries[:w.size]
		last := page.Deliveries[w.size-1]
		page.NextPageToken = encodePageToken(pageToken{Q: w.fp, T: last.Time.UnixMilli(),
			ID: last.EventID, S: uint64(last.Attempt)})
	}
	return page, nil
}
