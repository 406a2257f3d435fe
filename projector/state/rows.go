package state

import (
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// rowCache holds the rows of one partition as the last commit of this process left them,
// and the batches it applied in memory since, so that a batch loads only the sensors it has
// not seen. It is valid only while the checkpoint is where that commit put it: anything
// else (a failed transaction, another writer) empties it.
type rowCache struct {
	rows map[string]row
	cp   uint64 // the checkpoint after the commit the rows reflect
	// applied is the last sequence applied to rows: beyond cp when batches that changed
	// nothing but liveness were applied in memory only (applyInMemory).
	applied uint64
	// counted is the last sequence counted in locks_state_applied_total. Unlike the rest it
	// outlives clear: readings applied in memory and delivered again after the reader
	// resumed from the checkpoint are applied again, but were counted once.
	counted uint64
	// table is sensor_state's oid when the rows were loaded: a rebuild swaps another table
	// in under the same name (see rebuild.go), and the rows cached are then not its rows.
	table uint32
	max   int
	// stream is the identity of the READINGS stream the partition's consumer reads (set
	// when it is created): a batch refuses a checkpoint written on another stream, and
	// writes this one with its own. Empty: not known (the checkpoint's is kept).
	stream string
	// pending are the sensors whose rows hold liveness not written yet (seen.go), since
	// pendingSince; each is in rows.
	pending      map[string]struct{}
	pendingSince time.Time
	// stale: the memory was lost (a new cache, or cleared), and the checkpoint may say that
	// liveness deferred before is to be replayed (partitionWorker.flushSeen).
	stale bool
}

func newRowCache(max int) *rowCache {
	return &rowCache{rows: make(map[string]row), pending: make(map[string]struct{}), max: max, stale: true}
}

// clear forgets the rows, and with them the pending liveness: checkpoints.seen_seq says
// where it is replayed from (recoverSeen).
func (c *rowCache) clear() {
	clear(c.rows)
	clear(c.pending)
	c.cp, c.applied, c.stale = 0, 0, true
}

// ahead says whether rows hold readings beyond the checkpoint, applied in memory only.
func (c *rowCache) ahead() bool { return c.applied > c.cp }

// errMemoryAhead fails a transaction that finds the partition's rows or checkpoint changed
// by someone else while this process held readings applied in memory only: they are not in
// what it would reload, so the worker reads them again from the checkpoint.
var errMemoryAhead = errors.New("the checkpoint or sensor_state changed under readings applied in memory only; reading again from the checkpoint")

// forget clears the cache when the transaction found it is not the partition's memory any
// more, or fails with errMemoryAhead when that would lose readings applied in memory only.
func (c *rowCache) forget() error {
	if c.ahead() {
		return errMemoryAhead
	}
	c.clear()
	return nil
}

// selectRows joins the keys to sensor_state, one index probe each with keyedJoins
// (sensor_id = ANY($1) would probe every partition for every key).
const selectRows = `SELECT s.sensor_id, s.data, s.last_seen, s.last_reading_time, s.changed_at, s.revision, s.connection, s.last_seq
	FROM unnest($1::text[]) AS k(sensor_id) JOIN sensor_state s ON s.sensor_id = k.sensor_id`

func scanRows(rows pgx.Rows, into map[string]row) error {
	defer rows.Close()
	for rows.Next() {
		var id, conn string
		var r row
		var data int16
		var lastSeq int64
		if err := rows.Scan(&id, &data, &r.lastSeen, &r.lastReadingTime, &r.changedAt, &r.revision, &conn, &lastSeq); err != nil {
			return fmt.Errorf("scan sensor_state: %w", err)
		}
		r.data, r.lost, r.lastSeq = uint8(data), conn == "lost", uint64(lastSeq)
		r.lastSeen, r.lastReadingTime, r.changedAt = r.lastSeen.UTC(), r.lastReadingTime.UTC(), r.changedAt.UTC()
		into[id] = r
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("load sensor_state: %w", err)
	}
	return nil
}

// columns are sensor_state rows as column arrays, for unnest.
type columns struct {
	id                  []string
	part                []int32
	data                []int16
	seen, read, changed []time.Time
	rev                 []int64
	conn                []string
	seq                 []int64
}

func (c *columns) add(id string, p int, r row) {
	conn := "online"
	if r.lost {
		conn = "lost"
	}
	c.id, c.part, c.data = append(c.id, id), append(c.part, int32(p)), append(c.data, int16(r.data))
	c.seen, c.read, c.changed = append(c.seen, r.lastSeen), append(c.read, r.lastReadingTime), append(c.changed, r.changedAt)
	c.rev, c.conn, c.seq = append(c.rev, r.revision), append(c.conn, conn), append(c.seq, int64(r.lastSeq))
}

// queueRows queues the writes of rows to table (sensor_state, or a rebuild's shadow):
// upd are rows known to exist, updated in place with UPDATE … FROM unnest rather than
// INSERT … ON CONFLICT (no speculative insertion), ins new rows. When upd has rows, the
// UPDATE is the batch's first statement, for the caller to check its row count.
func queueRows(b *pgx.Batch, table string, upd, ins *columns) {
	t := pgx.Identifier{table}.Sanitize()
	if len(upd.id) > 0 {
		b.Queue(`UPDATE `+t+` s SET data = u.data, last_seen = u.last_seen,
				last_reading_time = u.last_reading_time, changed_at = u.changed_at, revision = u.revision,
				connection = u.connection, last_seq = u.last_seq
			FROM unnest($1::text[], $2::smallint[], $3::timestamptz[], $4::timestamptz[], $5::timestamptz[], $6::bigint[], $7::text[], $8::bigint[])
				AS u(sensor_id, data, last_seen, last_reading_time, changed_at, revision, connection, last_seq)
			WHERE s.sensor_id = u.sensor_id`,
			upd.id, upd.data, upd.seen, upd.read, upd.changed, upd.rev, upd.conn, upd.seq)
	}
	if len(ins.id) > 0 {
		b.Queue(`INSERT INTO `+t+` (sensor_id, partition, data, last_seen, last_reading_time, changed_at, revision, connection, last_seq)
			SELECT * FROM unnest($1::text[], $2::int[], $3::smallint[], $4::timestamptz[], $5::timestamptz[], $6::timestamptz[], $7::bigint[], $8::text[], $9::bigint[])`,
			ins.id, ins.part, ins.data, ins.seen, ins.read, ins.changed, ins.rev, ins.conn, ins.seq)
	}
}
