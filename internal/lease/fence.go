package lease

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lock-sensors/lock-sensors/internal/clock"
)

// ErrFenced is returned by a fenced transaction whose epoch is no longer the partition's: the
// partition was claimed by another process since, and nothing of the transaction commits.
var ErrFenced = errors.New("partition claimed by another owner")

// FencedError names the partition and the two epochs; it unwraps to ErrFenced.
type FencedError struct {
	Name      string
	Partition int
	Epoch     int64 // the transaction's
	Current   int64 // the partition's now (0: no owner row)
}

func (e *FencedError) Error() string {
	return fmt.Sprintf("%s partition %d: epoch %d is not the current one (%d): %v", e.Name, e.Partition, e.Epoch, e.Current, ErrFenced)
}

func (e *FencedError) Unwrap() error { return ErrFenced }

// IdleInTransaction bounds how long a fenced transaction may sit idle: a process paused inside
// one (SIGSTOP, a long GC) would otherwise hold the owner row, and the next owner's claim
// would wait for it for ever.
const IdleInTransaction = 3 * time.Second

// Claim makes owner the owner of partition p of name in Postgres and returns its new epoch.
// It waits for a transaction of the previous owner that holds the row (fenced transactions
// lock it) and makes every later one of that owner roll back.
func Claim(ctx context.Context, pg *pgxpool.Pool, name string, p int, owner string) (int64, error) {
	var epoch int64
	err := pg.QueryRow(ctx, `INSERT INTO partition_owners (projection, partition, owner, epoch) VALUES ($1, $2, $3, 1)
		ON CONFLICT (projection, partition) DO UPDATE SET owner = excluded.owner, epoch = partition_owners.epoch + 1, claimed_at = now()
		RETURNING epoch`, name, p, owner).Scan(&epoch)
	if err != nil {
		return 0, fmt.Errorf("claim %s partition %d: %w", name, p, err)
	}
	return epoch, nil
}

// QueueCheck queues, at the start of a transaction's first batch, the statements of the fence:
// the idle bound, then a lock on the owner row that a claim must wait for. Read the results
// with ReadCheck before anything else queued after them.
func QueueCheck(b *pgx.Batch, name string, p int) {
	b.Queue(fmt.Sprintf(`SET LOCAL idle_in_transaction_session_timeout = %d`, IdleInTransaction.Milliseconds()))
	b.Queue(`SELECT epoch FROM partition_owners WHERE projection = $1 AND partition = $2 FOR SHARE`, name, p)
}

// ReadCheck reads what QueueCheck queued and fails with a *FencedError unless epoch is the
// partition's current one.
func ReadCheck(br pgx.BatchResults, name string, p int, epoch int64) error {
	if _, err := br.Exec(); err != nil {
		return fmt.Errorf("fence %s partition %d: %w", name, p, err)
	}
	var cur int64
	if err := br.QueryRow().Scan(&cur); err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("fence %s partition %d: %w", name, p, err)
	}
	if cur != epoch {
		return &FencedError{Name: name, Partition: p, Epoch: epoch, Current: cur}
	}
	return nil
}

// Check is the fence as its own round trip, for a transaction that has no batch to join.
func Check(ctx context.Context, tx pgx.Tx, name string, p int, epoch int64) error {
	b := &pgx.Batch{}
	QueueCheck(b, name, p)
	br := tx.SendBatch(ctx, b)
	err := ReadCheck(br, name, p, epoch)
	if cerr := br.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("fence %s partition %d: %w", name, p, cerr)
	}
	return err
}

type untilKey struct{}

// validity is what Valid reads from a Work's ctx: the end of the lease's last renewal plus
// its TTL, by the Assigner's clock.
type validity struct {
	until *atomic.Pointer[time.Time]
	clock clock.Clock
}

// renew records a successful write of the lease sent at t, for the round and for Valid.
func (h *hold) renew(t time.Time, ttl time.Duration) {
	h.renewed, h.lapsed = t, false
	until := t.Add(ttl)
	h.until.Store(&until)
}

// Valid reports whether the Work whose ctx this is may still act for its partition: ctx is
// live and, for a leased partition, the lease was renewed less than TTL ago. The server keeps
// a lease at least TTL after its last write was sent, so a Work that checks Valid before an
// effect the Postgres fence cannot cover (a NATS publish) stops before another process can
// claim the partition. A fixed partition (--partitions) has no lease: only ctx counts.
func Valid(ctx context.Context) bool {
	if ctx.Err() != nil {
		return false
	}
	v, ok := ctx.Value(untilKey{}).(validity)
	return !ok || v.clock.Now().Before(*v.until.Load())
}
