package history

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/lock-sensors/lock-sensors/history"
	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/partition"
)

// historyPartitionCount is the number of partitions of table's active parts.
func historyPartitionCount(t testing.TB, ch driver.Conn, table string) uint64 {
	t.Helper()
	var n uint64
	if err := ch.QueryRow(t.Context(), `SELECT toUInt64(uniqExact(partition)) FROM system.parts
		WHERE database = currentDatabase() AND table = '`+table+`' AND active`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// A sensor whose clock says 101 different months (1970 after a battery change, decades
// ahead) must not stop history. Current ClickHouse refuses an INSERT whose rows fall in more
// than 100 partitions ("Too many partitions for single INSERT block", max_partitions_per_insert_block),
// and the projector retried that batch for ever, so no sensor's history moved again. 18.16
// (Debian's, which the tests run on) has no such limit, so the test checks the cause itself:
// those rows, and the events whose occurred_at is that clock, must fall in the partitions of
// their receive time, not of the sensor's time, while every sensor's readings keep arriving and
// the API's time filters still select by the sensor's time.
func TestHistorySensorClocks(t *testing.T) {
	t.Parallel()
	e := newHistoryEnv(t)
	received := time.Now().UTC().Truncate(time.Millisecond)
	const months = 101
	var logs []event.Log
	for i := range months {
		// 1970-01 onwards, a month apart: 1970 … 1978, as after a battery change.
		ts := time.Date(1970, time.Month(1+i), 15, 12, 0, 0, 0, time.UTC)
		if i%2 == 1 {
			ts = ts.AddDate(80, 0, 0) // and decades ahead
		}
		logs = append(logs, event.Log{V: event.Version, Kind: event.KindReading, SensorID: "clock", Data: uint8(i % 2),
			Time: ts, ReceivedTime: received.Add(time.Duration(i) * time.Millisecond), MessageID: fmt.Sprint("c", i)})
	}
	others := historyReadings(20, 400, received, 0)
	var other uint64
	for _, l := range others {
		if l.Kind == event.KindReading {
			other++
		}
	}
	// Interleaved, as sensors send, and appended as the bridge appends: one message per
	// reading on the sensor's subject, with a Nats-Msg-Id.
	var all []event.Log
	for i := range max(len(logs), len(others)) {
		if i < len(logs) {
			all = append(all, logs[i])
		}
		if i < len(others) {
			all = append(all, others[i])
		}
	}
	for i, l := range all {
		b, err := json.Marshal(l)
		if err != nil {
			t.Fatal(err)
		}
		msg := &nats.Msg{Subject: natsx.ReadingsSubject(l.SensorID), Data: b, Header: nats.Header{}}
		msg.Header.Set(jetstream.MsgIDHeader, fmt.Sprint("id-", i))
		if _, err := e.nats.JS.PublishMsg(t.Context(), msg); err != nil {
			t.Fatal(err)
		}
	}
	// The state changes of the same sensor carry its clock as occurred_at.
	for i, l := range logs {
		rev := int64(i + 1)
		ev := event.Event{V: event.Version, ID: event.ID("clock", rev), Type: event.TypeStateChanged, OccurredAt: l.Time,
			SensorID: "clock", Data: l.Data, Revision: rev, Partition: partition.Of("clock", historyPartitions), Seq: uint64(i + 1)}
		b, _ := json.Marshal(ev)
		if _, err := e.nats.JS.Publish(t.Context(), natsx.EventsSubject(ev.Partition, ev.SensorID), b); err != nil {
			t.Fatal(err)
		}
	}

	_, stop := runHistory(t, historyTestConfig(), e.nats.JS, e.ch)
	defer stop()
	historyWaitRows(t, e.ch, months+other, 30*time.Second)
	st, _ := history.New(e.ch)
	var evs history.EventsPage
	deadline := time.Now().Add(20 * time.Second)
	for len(evs.Events) < months {
		var err error
		if evs, err = st.Events(t.Context(), "clock", history.Query{PageSize: 1000}); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d events of the sensor in ClickHouse, want %d", len(evs.Events), months)
		}
		time.Sleep(50 * time.Millisecond)
	}

	// The receive times span at most two months (the test may run across a month's end).
	for _, table := range []string{"readings", "events"} {
		if n := historyPartitionCount(t, e.ch, table); n > 2 {
			t.Errorf("%s: rows of one batch fall in %d partitions: partitioned by the sensor's clock, not by receive time", table, n)
		}
	}
	// Listed in the order received, each with the sensor's own time.
	rs, err := st.Readings(t.Context(), "clock", history.Query{PageSize: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if len(rs.Readings) != months {
		t.Fatalf("%d readings of the sensor listed, want %d", len(rs.Readings), months)
	}
	for i, r := range rs.Readings {
		if !r.Time.Equal(logs[i].Time) || !r.ReceivedTime.Equal(logs[i].ReceivedTime) || r.MessageID != logs[i].MessageID {
			t.Fatalf("reading %d: time %s received %s id %s, want %s, %s, %s", i, r.Time, r.ReceivedTime, r.MessageID,
				logs[i].Time, logs[i].ReceivedTime, logs[i].MessageID)
		}
	}
	for i, ev := range evs.Events {
		if ev.Revision != int64(i+1) || !ev.Time.Equal(logs[i].Time) {
			t.Fatalf("event %d: revision %d at %s, want %d at %s", i, ev.Revision, ev.Time, i+1, logs[i].Time)
		}
	}
	// start_time and end_time still select by the sensor's time: 1971 holds the 6 readings of
	// the even months 12…22 (January to November 1971).
	y1971 := history.Query{Start: time.Date(1971, 1, 1, 0, 0, 0, 0, time.UTC), End: time.Date(1972, 1, 1, 0, 0, 0, 0, time.UTC), PageSize: 1000}
	rs, err = st.Readings(t.Context(), "clock", y1971)
	if err != nil {
		t.Fatal(err)
	}
	evs, err = st.Events(t.Context(), "clock", y1971)
	if err != nil {
		t.Fatal(err)
	}
	if len(rs.Readings) != 6 || len(evs.Events) != 6 {
		t.Fatalf("1971: %d readings and %d events, want 6 and 6", len(rs.Readings), len(evs.Events))
	}
	for _, r := range rs.Readings {
		if r.Time.Year() != 1971 {
			t.Fatalf("reading of %s in 1971's range", r.Time)
		}
	}
}
