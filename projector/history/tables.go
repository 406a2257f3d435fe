package history

import (
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/lock-sensors/lock-sensors/internal/chschema"
	"github.com/lock-sensors/lock-sensors/internal/event"
)

// table is how one stream's messages become rows of one ClickHouse table.
type table struct {
	// name is the table written: schema's own, or a rebuild's shadow of it.
	name string
	// schema lists the columns, in the order columns returns them.
	schema chschema.Table
	// decode checks a message stored under subject in a log of partitions partitions and
	// turns it into a row: errNotARow for a message with no row, an error wrapping
	// event.ErrInvalid for one that fails the check (the live projector sets it aside).
	// The live projector and the rebuild share it, so both write the very same rows.
	decode func(subject string, data []byte, md *jetstream.MsgMetadata, partitions int) (any, error)
	// columns turns rows into one slice per column, for the batch's columnar Append.
	columns func(rows []any) []any
}

// errNotARow marks a message that is acked without a row (a liveness fact in READINGS).
var errNotARow = errors.New("not a history row")

var tables = []table{
	{
		name:    chschema.Readings.Name,
		schema:  chschema.Readings,
		decode:  decodeReading,
		columns: readingColumns,
	},
	{
		name:    chschema.Events.Name,
		schema:  chschema.Events,
		decode:  decodeEvent,
		columns: eventColumns,
	},
	{
		name:    chschema.Deliveries.Name,
		schema:  chschema.Deliveries,
		decode:  decodeDelivery,
		columns: deliveryColumns,
	},
}

// DateTime holds 1970-01-01 to 2106-02-07; a time outside is clamped to the edge rather than
// wrapped around or left to fail every retry of the batch it is in.
var maxTime = time.Date(2106, 2, 7, 0, 0, 0, 0, time.UTC)

// chTime splits t into DateTime seconds and milliseconds.
func chTime(t time.Time) (int64, uint16) {
	switch {
	case t.Before(time.Unix(0, 0)):
		return 0, 0
	case t.After(maxTime):
		return maxTime.Unix(), 0
	}
	ms := t.UnixMilli()
	return ms / 1000, uint16(ms % 1000)
}

type reading struct {
	sensorID, messageID string
	seq                 uint64
	data                uint8
	time, received      int64
	timeMS, receivedMS  uint16
}

func decodeReading(subject string, data []byte, md *jetstream.MsgMetadata, partitions int) (any, error) {
	l, err := event.CheckLog(subject, data, partitions)
	if err != nil {
		return nil, err
	}
	if l.Kind != event.KindReading {
		return nil, errNotARow
	}
	r := reading{sensorID: l.SensorID, messageID: l.MessageID, seq: md.Sequence.Stream, data: l.Data}
	t := l.Time
	if t.IsZero() {
		t = l.ReceivedTime
	}
	r.time, r.timeMS = chTime(t)
	r.received, r.receivedMS = chTime(l.ReceivedTime)
	return r, nil
}

func readingColumns(rows []any) []any {
	n := len(rows)
	var (
		sensor, msgID = make([]string, n), make([]string, n)
		seq           = make([]uint64, n)
		data          = make([]uint8, n)
		tm, rcv       = make([]int64, n), make([]int64, n)
		tmMS, rcvMS   = make([]uint16, n), make([]uint16, n)
	)
	for i, x := range rows {
		r := x.(reading)
		sensor[i], seq[i], data[i], tm[i], tmMS[i], rcv[i], rcvMS[i], msgID[i] =
			r.sensorID, r.seq, r.data, r.time, r.timeMS, r.received, r.receivedMS, r.messageID
	}
	return []any{sensor, seq, data, tm, tmMS, rcv, rcvMS, msgID}
}

type eventRow struct {
	id, sensorID, typ  string
	revision, seq      uint64
	data               uint8
	previous           *uint8
	time, received     int64
	timeMS, receivedMS uint16
}

func decodeEvent(subject string, data []byte, md *jetstream.MsgMetadata, partitions int) (any, error) {
	e, err := event.CheckEvent(subject, data, partitions)
	if err != nil {
		return nil, err
	}
	r := eventRow{id: e.ID, sensorID: e.SensorID, typ: e.Type, revision: uint64(e.Revision),
		seq: e.Seq, data: e.Data, previous: e.PreviousData}
	r.time, r.timeMS = chTime(e.OccurredAt)
	// occurred_at of a state change is the sensor's clock; the table is partitioned and
	// ordered by when EVENTS stored the event, which the server's clock decides.
	r.received, r.receivedMS = chTime(md.Timestamp)
	return r, nil
}

func eventColumns(rows []any) []any {
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
		r := x.(eventRow)
		id[i], sensor[i], typ[i], rev[i], data[i], prev[i], tm[i], tmMS[i], seq[i], rcv[i], rcvMS[i] =
			r.id, r.sensorID, r.typ, r.revision, r.data, r.previous, r.time, r.timeMS, r.seq, r.received, r.receivedMS
	}
	return []any{id, sensor, typ, rev, data, prev, tm, tmMS, seq, rcv, rcvMS}
}

type delivery struct {
	eventID, clientID, sensorID, err, outcome string
	attempt, status                           uint16
	latency                                   uint32
	time                                      int64
	timeMS                                    uint16
}

// decodeDelivery: DELIVERIES is written by the notifier alone, and only decoded.
func decodeDelivery(_ string, data []byte, _ *jetstream.MsgMetadata, _ int) (any, error) {
	a, err := event.DecodeAttempt(data)
	if err != nil {
		return nil, err
	}
	if a.EventID == "" || a.ClientID == "" {
		return nil, errors.New("attempt without event or client id")
	}
	r := delivery{eventID: a.EventID, clientID: a.ClientID, sensorID: a.SensorID, err: a.Error, outcome: a.Outcome,
		attempt: uint16(min(max(a.Attempt, 0), 65535)), status: uint16(min(max(a.StatusCode, 0), 65535)),
		latency: uint32(min(max(a.LatencyMS, 0), 1<<32-1))}
	r.time, r.timeMS = chTime(a.Time)
	return r, nil
}

func deliveryColumns(rows []any) []any {
	n := len(rows)
	var (
		ev, cl, se, er, out = make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		att, st             = make([]uint16, n), make([]uint16, n)
		lat                 = make([]uint32, n)
		tm                  = make([]int64, n)
		tmMS                = make([]uint16, n)
	)
	for i, x := range rows {
		r := x.(delivery)
		ev[i], cl[i], se[i], att[i], tm[i], tmMS[i], st[i], lat[i], er[i], out[i] =
			r.eventID, r.clientID, r.sensorID, r.attempt, r.time, r.timeMS, r.status, r.latency, r.err, r.outcome
	}
	return []any{ev, cl, se, att, tm, tmMS, st, lat, er, out}
}
