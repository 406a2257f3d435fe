package e2e_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// pgMeter measures what a span of work cost Postgres in the test's own database, apart from
// whatever else the shared server does: the CPU of that database's backends (from /proc, by
// the pids pg_stat_activity lists), its statements' time (pg_stat_database.active_time) and
// its transactions. Backends report their statistics up to a few seconds late (pgstat flushes
// an idle backend's within 10 s), so stop waits before its last read.
type pgMeter struct {
	pool  *pgxpool.Pool
	pid   int
	start pgSample
	idle  pgCost // over pgFlush before start
}

// pgCost is what a span cost.
type pgCost struct {
	CPU      time.Duration // the database's backends
	Active   time.Duration // statements executing
	Xacts    int64
	LocksCPU time.Duration // the `locks run` process
	Wall     time.Duration
	Idle     *pgCost // what the idle system cost over a span before, subtracted
}

func (m *pgMeter) read(ctx context.Context) (cpu map[int]float64, active float64, xacts int64, err error) {
	if err := m.pool.QueryRow(ctx, `SELECT active_time, xact_commit + xact_rollback FROM pg_stat_database
		WHERE datname = current_database()`).Scan(&active, &xacts); err != nil {
		return nil, 0, 0, fmt.Errorf("pg_stat_database: %w", err)
	}
	rows, err := m.pool.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE datname = current_database()`)
	if err != nil {
		return nil, 0, 0, fmt.Errorf("pg_stat_activity: %w", err)
	}
	defer rows.Close()
	cpu = map[int]float64{}
	for rows.Next() {
		var pid int
		if err := rows.Scan(&pid); err != nil {
			return nil, 0, 0, err
		}
		if c, ok := testenv.ProcCPU(pid); ok {
			cpu[pid] = c
		}
	}
	return cpu, active, xacts, rows.Err()
}

// sample is the counters at one moment.
type pgSample struct {
	at       time.Time
	cpu      map[int]float64 // backend pid → CPU seconds
	active   float64         // ms
	xacts    int64
	locksCPU float64
}

func (m *pgMeter) sample(tb testing.TB) pgSample {
	tb.Helper()
	cpu, active, xacts, err := m.read(context.Background())
	if err != nil {
		tb.Fatal(err)
	}
	locks, _ := testenv.ProcCPU(m.pid)
	return pgSample{time.Now(), cpu, active, xacts, locks}
}

// since is what the counters grew from a to b, as a cost over b.at − a.at.
func since(a, b pgSample) pgCost {
	var c float64
	for pid, s := range b.cpu {
		c += s - a.cpu[pid] // a backend started since: all of its CPU
	}
	return pgCost{CPU: secs(c), Active: time.Duration((b.active - a.active) * float64(time.Millisecond)), Xacts: b.xacts - a.xacts,
		LocksCPU: secs(b.locksCPU - a.locksCPU), Wall: b.at.Sub(a.at)}
}

func secs(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// per scales c to a span of d.
func (c pgCost) per(d time.Duration) pgCost {
	f := d.Seconds() / c.Wall.Seconds()
	return pgCost{CPU: secs(c.CPU.Seconds() * f), Active: secs(c.Active.Seconds() * f), Xacts: int64(float64(c.Xacts) * f),
		LocksCPU: secs(c.LocksCPU.Seconds() * f), Wall: d}
}

// startPG starts measuring the database of pool and the `locks` process pid, after measuring
// for pgFlush what the idle system costs (leases, polls, sweeps), which stop subtracts; the
// system must be idle from the call on.
func startPG(tb testing.TB, pool *pgxpool.Pool, pid int) *pgMeter {
	tb.Helper()
	m := &pgMeter{pool: pool, pid: pid}
	time.Sleep(pgFlush) // what came before (the registration) reported first
	a := m.sample(tb)
	time.Sleep(pgFlush)
	m.start = m.sample(tb)
	m.idle = since(a, m.start)
	return m
}

// pgFlush is longer than a backend keeps its statistics before it reports them.
const pgFlush = 11 * time.Second

// stop ends the span at end (the work's last moment; wall time is counted to it), reading the
// statement time and transactions after the statistics' flush delay, and subtracting what
// the idle system would have cost over the same time.
func (m *pgMeter) stop(tb testing.TB, end time.Time) pgCost {
	tb.Helper()
	now := m.sample(tb) // CPU from /proc is current
	time.Sleep(pgFlush)
	late := m.sample(tb)
	c, l := since(m.start, now), since(m.start, late)
	ic, il := m.idle.per(c.Wall), m.idle.per(l.Wall)
	return pgCost{CPU: max(c.CPU-ic.CPU, 0), LocksCPU: max(c.LocksCPU-ic.LocksCPU, 0), Active: max(l.Active-il.Active, 0),
		Xacts: max(l.Xacts-il.Xacts, 0), Wall: end.Sub(m.start.at), Idle: &m.idle}
}

// report reports the cost per unit of work (µs of Postgres backend CPU, of statement time,
// of the locks process's CPU, and transactions) and logs it.
func (c pgCost) report(b *testing.B, n float64, unit string) {
	us := func(d time.Duration) float64 { return float64(d.Microseconds()) / n }
	b.ReportMetric(us(c.CPU), "pg-cpu-µs/"+unit)
	b.ReportMetric(us(c.Active), "pg-active-µs/"+unit)
	b.ReportMetric(float64(c.Xacts)/n, "pg-xacts/"+unit)
	b.ReportMetric(us(c.LocksCPU), "locks-cpu-µs/"+unit)
	say(b, "per %s over %.0f of them in %s: Postgres backends' CPU %.0f µs, statements %.0f µs, %.2f transactions; the locks process's CPU %.0f µs (less the idle system's, per second: %.0f ms, %.0f ms, %.1f, %.0f ms)",
		unit, n, c.Wall.Round(time.Millisecond), us(c.CPU), us(c.Active), float64(c.Xacts)/n, us(c.LocksCPU),
		ms(c.Idle.CPU)/c.Idle.Wall.Seconds(), ms(c.Idle.Active)/c.Idle.Wall.Seconds(), float64(c.Idle.Xacts)/c.Idle.Wall.Seconds(), ms(c.Idle.LocksCPU)/c.Idle.Wall.Seconds())
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// say logs a figure both ways: in the benchmark's log, which go test cuts after ten lines of
// a benchmark that passed, and on stderr with the progress lines.
func say(b *testing.B, format string, args ...any) {
	b.Helper()
	b.Logf(format, args...)
	progress(format, args...)
}

// progress prints a line for a person waiting (stderr: the benchmark's own log comes at its end).
func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, time.Now().UTC().Format("15:04:05 ")+format+"\n", args...)
}
