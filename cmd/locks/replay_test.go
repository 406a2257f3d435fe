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
	if err := pg.QueryRow(t.Context(), `SELECT count(*) FROM pg_tables WHERE tablename LIKE 'sensor_state%'`).Scan(&old); err != nil {
		t.Fatal(err)
	}
	if old != 1 {
		t.Errorf("%d sensor_state tables after replay and --drop-old, want 1", old)
	}
}
