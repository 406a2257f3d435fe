package pgtx_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lock-sensors/lock-sensors/internal/pgtx"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

func pool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	ctx := context.Background()
	p, err := pgxpool.New(ctx, testenv.PostgresURL(t)+"&pool_max_conns=1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	if _, err := p.Exec(ctx, `CREATE TABLE t (k int PRIMARY KEY, v text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return p
}

func rows(t *testing.T, p *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := p.QueryRow(context.Background(), `SELECT count(*) FROM t`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// A transaction of two batches: the first reads, the second writes what it read and commits.
func TestTwoBatchesCommit(t *testing.T) {
	p := pool(t)
	ctx := context.Background()
	err := pgtx.Run(ctx, p, func(tx *pgtx.Tx) error {
		b := &pgx.Batch{}
		b.Queue(`INSERT INTO t VALUES (1, 'a')`)
		b.Queue(`SELECT count(*) FROM t`)
		var n int
		if err := tx.Send(ctx, b, func(br pgx.BatchResults) error {
			if _, err := br.Exec(); err != nil {
				return err
			}
			return br.QueryRow().Scan(&n)
		}); err != nil {
			return err
		}
		if n != 1 {
			t.Errorf("the transaction sees %d rows of its own, want 1", n)
		}
		w := &pgx.Batch{}
		w.Queue(`INSERT INTO t VALUES (2, 'b')`)
		return tx.Commit(ctx, w, nil)
	})
	if err != nil {
		t.Fatal(err)
	}
	if n := rows(t, p); n != 2 {
		t.Fatalf("%d rows after commit, want 2", n)
	}
}

// A statement failing in the last batch rolls back the first batch's writes too, and the
// connection goes back to the pool usable (the pool has one).
func TestFailureRollsBackEverything(t *testing.T) {
	p := pool(t)
	ctx := context.Background()
	err := pgtx.Run(ctx, p, func(tx *pgtx.Tx) error {
		b := &pgx.Batch{}
		b.Queue(`INSERT INTO t VALUES (1, 'a')`)
		if err := tx.Send(ctx, b, nil); err != nil {
			return err
		}
		w := &pgx.Batch{}
		w.Queue(`INSERT INTO t VALUES (2, 'b')`)
		w.Queue(`INSERT INTO t VALUES (1, 'duplicate')`)
		return tx.Commit(ctx, w, nil)
	})
	if err == nil {
		t.Fatal("a duplicate key committed")
	}
	if n := rows(t, p); n != 0 {
		t.Fatalf("%d rows after a failed transaction, want 0", n)
	}
}

// fn failing between batches, or forgetting to commit, leaves nothing behind.
func TestFnErrorAndMissingCommitRollBack(t *testing.T) {
	p := pool(t)
	ctx := context.Background()
	mine := errors.New("changed my mind")
	for _, tc := range []struct {
		name string
		end  error
		want error
	}{{"fn fails", mine, mine}, {"no commit", nil, pgtx.ErrNotCommitted}} {
		err := pgtx.Run(ctx, p, func(tx *pgtx.Tx) error {
			b := &pgx.Batch{}
			b.Queue(`INSERT INTO t VALUES (1, 'a')`)
			if err := tx.Send(ctx, b, nil); err != nil {
				return err
			}
			return tc.end
		})
		if !errors.Is(err, tc.want) {
			t.Fatalf("%s: Run = %v, want %v", tc.name, err, tc.want)
		}
		if n := rows(t, p); n != 0 {
			t.Fatalf("%s: %d rows, want 0", tc.name, n)
		}
	}
}

// A transaction of one batch is BEGIN, the batch and COMMIT in one round trip.
func TestCommitOnly(t *testing.T) {
	p := pool(t)
	ctx := context.Background()
	err := pgtx.Run(ctx, p, func(tx *pgtx.Tx) error {
		b := &pgx.Batch{}
		b.Queue(`INSERT INTO t VALUES (1, 'a')`)
		b.Queue(`INSERT INTO t VALUES (2, 'b')`)
		return tx.Commit(ctx, b, nil)
	})
	if err != nil {
		t.Fatal(err)
	}
	if n := rows(t, p); n != 2 {
		t.Fatalf("%d rows, want 2", n)
	}
}
