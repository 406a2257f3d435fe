// Package pgtx runs a Postgres transaction made of pipelined batches with its BEGIN sent in
// the first batch and its COMMIT in the last, so that a transaction of n batches costs n
// round trips instead of n+2. On a busy database every round trip waits to be scheduled;
// the hot transactions on a reading's way to its webhook are two or three batches each.
package pgtx

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Pool is where a transaction takes its connection (a *pgxpool.Pool).
type Pool interface {
	Acquire(ctx context.Context) (*pgxpool.Conn, error)
}

// Tx is a transaction under way; its batches go out with Send, the last with Commit.
type Tx struct {
	conn      *pgx.Conn
	begun     bool
	committed bool
}

// ErrNotCommitted is returned by Run when fn returned nil without calling Commit.
var ErrNotCommitted = errors.New("pgtx: the transaction was not committed")

// Run runs fn in a transaction on a connection of pool. When fn fails, or a statement does,
// the transaction is rolled back and the error returned; fn must end with Commit.
func Run(ctx context.Context, pool Pool, fn func(*Tx) error) error {
	c, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	t := &Tx{conn: c.Conn()}
	err = fn(t)
	if err == nil && !t.committed {
		err = ErrNotCommitted
	}
	if err != nil && t.conn.PgConn().TxStatus() != 'I' {
		// Rolled back on a context of its own: fn's may be what ended it.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		if _, rerr := t.conn.Exec(rctx, "rollback"); rerr != nil {
			// A connection whose state is unknown must not go back to the pool.
			_ = c.Conn().Close(rctx)
		}
		cancel()
	}
	c.Release()
	return err
}

// Conn is the transaction's connection, for statements between its batches once the first
// Send has begun it.
func (t *Tx) Conn() *pgx.Conn { return t.conn }

// Send sends b in the transaction (after BEGIN, in the same round trip, for the first
// batch) and reads its results with read, which must read every statement of b in order.
func (t *Tx) Send(ctx context.Context, b *pgx.Batch, read func(pgx.BatchResults) error) error {
	return t.send(ctx, b, read, false)
}

// Commit sends b, which may be empty, followed by COMMIT, and reads b's results with read
// (nil when b is empty). It fails when the transaction did not commit.
func (t *Tx) Commit(ctx context.Context, b *pgx.Batch, read func(pgx.BatchResults) error) error {
	return t.send(ctx, b, read, true)
}

func (t *Tx) send(ctx context.Context, b *pgx.Batch, read func(pgx.BatchResults) error, commit bool) error {
	if t.committed {
		return errors.New("pgtx: the transaction has ended")
	}
	full := &pgx.Batch{}
	if !t.begun {
		full.Queue("begin")
	}
	if b != nil {
		full.QueuedQueries = append(full.QueuedQueries, b.QueuedQueries...)
	}
	if commit {
		full.Queue("commit")
	}
	br := t.conn.SendBatch(ctx, full)
	err := t.readAll(br, b, read, commit)
	if cerr := br.Close(); err == nil && cerr != nil {
		err = cerr
	}
	t.begun = true
	if err == nil && commit {
		if s := t.conn.PgConn().TxStatus(); s != 'I' {
			return fmt.Errorf("pgtx: commit left the connection in transaction state %q", s)
		}
		t.committed = true
	}
	return err
}

func (t *Tx) readAll(br pgx.BatchResults, b *pgx.Batch, read func(pgx.BatchResults) error, commit bool) error {
	if !t.begun {
		if _, err := br.Exec(); err != nil {
			return fmt.Errorf("begin: %w", err)
		}
	}
	if read != nil {
		if err := read(br); err != nil {
			return err
		}
	} else if b != nil {
		for range b.QueuedQueries {
			if _, err := br.Exec(); err != nil {
				return err
			}
		}
	}
	if commit {
		tag, err := br.Exec()
		if err != nil {
			return fmt.Errorf("commit: %w", err)
		}
		if tag.String() != "COMMIT" {
			return fmt.Errorf("pgtx: the transaction was rolled back (%s)", tag)
		}
	}
	return nil
}
