package faults_test

import (
	"context"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"

	"github.com/lock-sensors/lock-sensors/internal/backoff"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// dbDown is how long a killed database stays down before it is started again.
const dbDown = 5 * time.Second

// Restart Postgres mid-run: a private server (the machine's shared one serves other tests),
// SIGKILLed with every backend while the projectors, the notifier, the watchdog and the API
// use it, kept down dbDown and started again on its data (crash recovery). Nothing is lost:
// the books, every webhook once, gapless revisions in EVENTS and sensor_state. The stalls
// are logged, not bounded: the database is down on purpose.
func TestFaultPostgresRestarted(t *testing.T) {
	requireFaults(t)
	pg := testenv.PrivatePostgres(t)
	rabbit := testenv.RabbitMQ(t)
	r := startRun(t, servers{pgURL: pg.URL, chAddr: testenv.ClickHouseAddr(), amqpURL: rabbit.URL, queue: rabbit.Queue}, 60*time.Second)
	r.checkStalls = false
	r.warm()
	at := time.Now()
	pg.Kill()
	if !backoff.Sleep(t.Context(), dbDown) {
		t.Fatal("the test ended while Postgres was down")
	}
	pg.Start()
	t.Logf("Postgres SIGKILLed, down %s, up again after %s", dbDown, time.Since(at).Round(100*time.Millisecond))
	res := r.finish()
	t.Logf("committed readings stood still %s around the kill; longest webhook stall %s",
		r.stallAround(at).Round(time.Second), res.hooksStall.Round(time.Second))
}

// Restart ClickHouse mid-run: a private clickhouse-server, SIGKILLed while the history
// projector writes, kept down dbDown and started again on its data. Nothing is lost in the
// history: every recorded reading is in ClickHouse's readings, once per READINGS sequence.
func TestFaultClickHouseRestarted(t *testing.T) {
	requireFaults(t)
	ch := testenv.PrivateClickHouse(t)
	rabbit := testenv.RabbitMQ(t)
	r := startRun(t, servers{pgURL: testenv.PostgresURL(t), chAddr: ch.Addr, chDB: "locks", amqpURL: rabbit.URL, queue: rabbit.Queue}, 60*time.Second)
	r.warm()
	before := historyReadings(t, ch.Addr)
	at := time.Now()
	ch.Kill()
	if !backoff.Sleep(t.Context(), dbDown) {
		t.Fatal("the test ended while ClickHouse was down")
	}
	ch.Start()
	t.Logf("ClickHouse SIGKILLed with %d readings in history, down %s, up again after %s", before, dbDown, time.Since(at).Round(100*time.Millisecond))
	res := r.finish()
	want := uint64(res.books.Published - res.books.Invalid)
	var got uint64
	deadline := time.Now().Add(settle)
	for got = historyReadings(t, ch.Addr); got < want && time.Now().Before(deadline); got = historyReadings(t, ch.Addr) {
		time.Sleep(time.Second)
	}
	var failed, written float64
	for _, p := range r.c.Of("history") {
		failed += metric(p, "locks_history_insert_errors_total")
		written += metric(p, "locks_history_rows_written_total")
	}
	t.Logf("history: %d distinct readings in ClickHouse, %d valid published; %.0f rows written, %.0f INSERTs failed and retried",
		got, want, written, failed)
	if failed < 1 {
		t.Error("no INSERT of the history projectors failed: the kill missed them and the scenario shows nothing")
	}
	if got != want {
		t.Errorf("history has %d readings, the books %d: %d lost", got, want, int64(want)-int64(got))
	}
}

// historyReadings is the number of distinct readings (READINGS sequences) in the history at
// addr: a batch written again after the kill is one row per sequence once merged, and counted once.
func historyReadings(t *testing.T, addr string) uint64 {
	t.Helper()
	c, err := clickhouse.Open(&clickhouse.Options{Addr: []string{addr}, Auth: clickhouse.Auth{Database: "locks"}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var n uint64
	if err := c.QueryRow(ctx, "SELECT toUInt64(uniqExact(seq)) FROM readings").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
