package testenv

import (
	"context"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
)

// Leftovers. A test process killed before its cleanups (a CI job cut off, a session ended,
// ^C) leaves its databases on the shared servers, and each one costs the servers a little
// for as long as it stays. Name stamps every name with its time, so that the next test
// process drops what is older than leftoverAge: a run in progress, of this checkout or
// another, is never that old. RabbitMQ's queues of such a run expire by a policy that
// deploy/local/services.sh sets (the AMQP protocol cannot list them).

// leftoverAge is how old a stamped database must be before a test process drops it.
const leftoverAge = 6 * time.Hour

// stamped matches a name Name made, capturing its time (base 36 Unix seconds).
var stamped = regexp.MustCompile(`^locks_[a-z_]+_([0-9a-z]{6,7})_[0-9a-f]{8}$`)

var pruneOnce struct{ pg, ch sync.Once }

// leftover says whether name is a database Name stamped before leftoverAge ago.
func leftover(name string, now time.Time) bool {
	m := stamped.FindStringSubmatch(name)
	if m == nil || strings.HasPrefix(name, trashPrefix) {
		return false
	}
	sec, err := strconv.ParseInt(m[1], 36, 64)
	return err == nil && now.Sub(time.Unix(sec, 0)) > leftoverAge
}

// prunePostgres discards, in the background, the leftover databases on the test Postgres.
func prunePostgres() {
	pruneOnce.pg.Do(func() {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			now := time.Now()
			for _, n := range pgDatabases(ctx, "locks_") {
				if leftover(n, now) {
					discardDatabase(ctx, n)
				}
			}
		}()
	})
}

// pruneClickHouse drops, in the background, the leftover databases on the test ClickHouse.
func pruneClickHouse() {
	pruneOnce.ch.Do(func() {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{ClickHouseAddr()}})
			if err != nil {
				return
			}
			defer conn.Close()
			rows, err := conn.Query(ctx, `SELECT name FROM system.databases WHERE startsWith(name, 'locks_')`)
			if err != nil {
				return
			}
			var names []string
			for rows.Next() {
				var n string
				if rows.Scan(&n) == nil {
					names = append(names, n)
				}
			}
			_ = rows.Close()
			now := time.Now()
			for _, n := range names {
				if leftover(n, now) {
					_ = conn.Exec(ctx, "DROP DATABASE IF EXISTS `"+n+"`")
				}
			}
		}()
	})
}
