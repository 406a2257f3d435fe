package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// locks replay rebuilds the state projection (here from readings no live projector has
// applied: the shadow follows the live checkpoints, so it stays empty) and swaps it in;
// so does the history one; --drop-old drops the replaced tables; another projection is a
// usage error.
func TestReplayCommand(t *testing.T) {
	t.Parallel()
	ns := testenv.NATS(t)
	pgURL, pg := testenv.Postgres(t)
	chURL, _ := testenv.ClickHouse(t)
	if err := natsx.Declare(t.Context(), ns.JS, natsx.StreamsConfig{Partitions: 2, LostAfter: time.Hour}); err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	b, _ := json.Marshal(event.Log{V: event.Version, Kind: event.KindReading, SensorID: "s1", Data: 1, Time: at, ReceivedTime: at})
	if _, err := ns.JS.PublishMsg(t.Context(), &nats.Msg{Subject: natsx.ReadingsSubject("s1"), Data: b}, jetstream.WithMsgID("r1")); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"LOCKS_NATS_URL": ns.URL, "LOCKS_POSTGRES_URL": pgURL, "LOCKS_PARTITIONS": "2", "LOCKS_CLICKHOUSE_URL": chURL}
	getenv := func(k string) string { return env[k] }
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"replay", "--projection=nope"}, 2, "want state, history or all"},
		{[]string{"replay", "--projection=state"}, 0, "replay done"},
		{[]string{"replay", "--projection=history"}, 0, "history projection rebuilt"},
		{[]string{"replay", "--drop-old", "--projection=all"}, 0, "readings_old_"},
	} {
		var out, errOut bytes.Buffer
		if code := run(c.args, getenv, &out, &errOut); code != c.code || !strings.Contains(errOut.String(), c.want) {
			t.Fatalf("locks %v: exit %d, want %d with %q in stderr:\n%s", c.args, code, c.code, c.want, errOut.String())
		}
	}
	var old int
	if err := pg.QueryRow(t.Context(), `SELECT count(*) FROM pg_class WHERE relname LIKE 'sensor_state%' AND relkind IN ('r', 'p') AND NOT relispartition`).Scan(&old); err != nil {
		t.Fatal(err)
	}
	if old != 1 {
		t.Errorf("%d sensor_state tables after replay and --drop-old, want 1", old)
	}
}

// --from-time resolves to the first READINGS message stored at or after the time and then
// behaves as --from-seq; it excludes --from-seq, and a time after the last message fails
// before anything is written.
func TestReplayFromTime(t *testing.T) {
	t.Parallel()
	ns := testenv.NATS(t)
	pgURL, _ := testenv.Postgres(t)
	if err := natsx.Declare(t.Context(), ns.JS, natsx.StreamsConfig{Partitions: 2, LostAfter: time.Hour}); err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	var stored []time.Time
	for i := range 3 {
		b, _ := json.Marshal(event.Log{V: event.Version, Kind: event.KindReading, SensorID: "s1", Data: uint8(i % 2), Time: at, ReceivedTime: at})
		ack, err := ns.JS.PublishMsg(t.Context(), &nats.Msg{Subject: natsx.ReadingsSubject("s1"), Data: b})
		if err != nil {
			t.Fatal(err)
		}
		st, err := ns.JS.Stream(t.Context(), natsx.ReadingsStream)
		if err != nil {
			t.Fatal(err)
		}
		m, err := st.GetMsg(t.Context(), ack.Sequence)
		if err != nil {
			t.Fatal(err)
		}
		stored = append(stored, m.Time)
		// The next message is stored strictly later.
		for !time.Now().After(m.Time.Add(2 * time.Millisecond)) {
			time.Sleep(time.Millisecond)
		}
	}
	env := map[string]string{"LOCKS_NATS_URL": ns.URL, "LOCKS_POSTGRES_URL": pgURL, "LOCKS_PARTITIONS": "2"}
	getenv := func(k string) string { return env[k] }
	rfc := func(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }
	for _, c := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"both flags", []string{"replay", "--from-seq=2", "--from-time=" + rfc(stored[1])}, 2, "--from-seq and --from-time exclude each other"},
		{"not RFC 3339", []string{"replay", "--from-time=yesterday"}, 2, "want an RFC 3339 time"},
		{"after the log", []string{"replay", "--from-time=" + rfc(stored[2].Add(time.Hour))}, 1, "no message at or after"},
		{"the second message", []string{"replay", "--from-time=" + rfc(stored[1])}, 0, "from_seq=2"},
		{"just before the third", []string{"replay", "--from-time=" + rfc(stored[2].Add(-time.Microsecond))}, 0, "from_seq=3"},
		{"before the log", []string{"replay", "--from-time=" + rfc(stored[0].Add(-time.Hour))}, 0, "from_seq=1"},
	} {
		var out, errOut bytes.Buffer
		if code := run(c.args, getenv, &out, &errOut); code != c.code || !strings.Contains(errOut.String(), c.want) {
			t.Fatalf("%s: locks %v: exit %d, want %d with %q in stderr:\n%s", c.name, c.args, code, c.code, c.want, errOut.String())
		}
	}
}
