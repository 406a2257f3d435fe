package projector

import (
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/lock-sensors/lock-sensors/internal/event"
)

// historyTable is how one stream's messages become rows of one ClickHouse table.
type historyTable struct {
	name string
	// insert names every column, in the order columns returns them (18.16 wants them named).
	insert string
	// decode turns a message into a row, or errNotARow for a message with no row.
	decode func(data []byte, md *jetstream.MsgMetadata) (any, error)
	// columns turns rows into one slice per column, for the batch's columnar Append.
	columns func(rows []any) []any
}

// errNotARow marks a message that is acked without a row (a liveness fact in READINGS).
var errNotARow = errors.New("not a history row")

var historyTables = []historyTable{
	{
		name:    "readings",
		insert:  "INSERT INTO readings (sensor_id, seq, data, time, time_ms, received, received_ms, message_id)",
		decode:  decodeHistoryReading,
		columns: historyReadingColumns,
	},
	{
		name:    "events",
		insert:  "INSERT INTO events (event_id, sensor_id, type, revision, data, previous_data, time, time_ms, seq, received, received_ms)",
		decode:  decodeHistoryEvent,
		columns: historyEventColumns,
	},
	{
		name:    "deliveries",
		insert:  "INSERT INTO deliveries (event_id, client_id, sensor_id, attempt, time, time_ms, status_code, latency_ms, error, outcome)",
		decode:  decodeHistoryDelivery,
		columns: historyDeliveryColumns,
	},
}

// DateTime holds 1970-01-01 to 2106-02-07; a time outside is clamped to the edge rather than
// wrapped around or left to fail every retry of the batch it is in.
var historyMaxTime = time.Date(2106, 2, 7, 0, 0, 0, 0, time.UTC)

// historyTime splits t into DateTime seconds and milliseconds.
func historyTime(t time.Time) (int64, uint16) {
	switch {
	case t.Before(time.Unix(0, 0)):
		return 0, 0
	case t.After(historyMaxTime):
		return historyMaxTime.Unix(), 0
	}
	ms := t.UnixMilli()
	return ms / 1000, uint16(ms % 1000)
}

type historyReading struct {
	sensorID, messageID string
	seq                 uint64
	data                uint8
	time, received      int64
	timeMS, receivedMS  uint16
}

func decodeHistoryReading(data []byte, md *jetstream.MsgMetadata) (any, error) {
	l, err := event.DecodeLog(data)
	if err != nil {
		return nil, err
	}
	if l.Kind != event.KindReading {
		return nil, errNotARow
	}
	r := historyReading{sensorID: l.SensorID, messageID: l.MessageID, seq: md.Sequence.Stream, data: l.Data}
	t := l.Time
	if t.IsZero() {
		t = l.ReceivedTime
	}
	r.time, r.timeMS = historyTime(t)
	r.received, r.receivedMS = historyTime(l.ReceivedTime)
	return r, nil
}

func historyReadingColumns(rows []any) []any {
	n := len(rows)
	var (
		sensor, msgID = make([]string, n), make([]string, n)
		seq           = make([]uint64, n)
		data          = make([]uint8, n)
		tm, rcv       = make([]int64, n), make([]int64, n)
		tmMS, rcvMS   = make([]uint16, n), make([]uint16, n)
	)
	for i, x := range rows {
		r := x.(historyReading)
		sensor[i], seq[i], data[i], tm[i], tmMS[i], rcv[i], rcvMS[i], msgID[i] =
			r.sensorID, r.seq, r.data, r.time, r.timeMS, r.received, r.receivedMS, r.messageID
	}
	return []any{sensor, seq, data, tm, tmMS, rcv, rcvMS, msgID}
}

type historyEvent struct {
	id, sensorID, typ  string
	revision, seq      uint64
	data               uint8
	previous           *uint8
	time, received     int64
	timeMS, receivedMS uint16
}

func decodeHistoryEvent(data []byte, md *jetstream.MsgMetadata) (any, error) {
	e, err := event.DecodeEvent(data)
	if err != nil {
		return nil, err
	}
	if e.ID == "" || e.SensorID == "" || e.Revision < 0 {
		return nil, errors.New("event without id, sensor or revision")
	}
	r := historyEvent{id: e.ID, sensorID: e.SensorID, typ: e.Type, revision: uint64(e.Revision),
		seq: e.Seq, data: e.Data, previous: e.PreviousData}
	r.time, r.timeMS = historyTime(e.OccurredAt)
	// occurred_at of a state change is the sensor's clock; the table is partitioned and
	// ordered by when EVENTS stored the event, which the server's clock decides.
	r.received, r.receivedMS = historyTime(md.Timestamp)
	return r, nil
}

func historyEventColumns(rows []any) []any {
	n := len(rows)
	var (
		id, sensor, typ = make([]string, n), make([]string, n), make([]string, n)
		rev, seq        = make([]uint64, n), make([]uint64, n)
		data            = make([]uint8, n)
		prev            = make([]*uint8, n)
		tm, rcv         = make([]int64, n), make([]int64, n)
		tmMS, rcvMS     = make([]uint16, n), make([]uint16, n)
	)
	for i, x := range rows {
		r := x.(historyEvent)
		id[i], sensor[i], typ[i], rev[i], data[i], prev[i], tm[i], tmMS[i], seq[i], rcv[i], rcvMS[i] =
			r.id, r.sensorID, r.typ, r.revision, r.data, r.previous, r.time, r.timeMS, r.seq, r.received, r.receivedMS
	}
	return []any{id, sensor, typ, rev, data, prev, tm, tmMS, seq, rcv, rcvMS}
}

type historyDelivery struct {
	eventID, clientID, sensorID, err, outcome string
	attempt, status                           uint16
	latency                                   uint32
	time                                      int64
	timeMS                                    uint16
}

func decodeHistoryDelivery(data []byte, _ *jetstream.MsgMetadata) (any, error) {
	a, err := event.DecodeAttempt(data)
	if err != nil {
		return nil, err
	}
	if a.EventID == "" || a.ClientID == "" {
		return nil, errors.New("attempt without event or client id")
	}
	r := historyDelivery{eventID: a.EventID, clientID: a.ClientID, sensorID: a.SensorID, err: a.Error, outcome: a.Outcome,
		attempt: uint16(min(max(a.Attempt, 0), 65535)), status: uint16(min(max(a.StatusCode, 0), 65535)),
		latency: uint32(min(max(a.LatencyMS, 0), 1<<32-1))}
	r.time, r.timeMS = historyTime(a.Time)
	return r, nil
}

func historyDeliveryColumns(rows []any) []any {
	n := len(rows)
	var (
		ev, cl, se, er, out = make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		att, st             = make([]uint16, n), make([]uint16, n)
		lat                 = make([]uint32, n)
		tm                  = make([]int64, n)
		tmMS                = make([]uint16, n)
	)
	for i, x := range rows {
		r := x.(historyDelivery)
		ev[i], cl[i], se[i], att[i], tm[i], tmMS[i], st[i], lat[i], er[i], out[i] =
			r.eventID, r.clientID, r.sensorID, r.attempt, r.time, r.timeMS, r.status, r.latency, r.err, r.outcome
	}
	return []any{ev, cl, se, att, tm, tmMS, st, lat, er, out}
}
