// Package pgplan keeps the planner on index probes for statements that join a batch of keys
// (an unnest of parameters) to a table partitioned by hash(sensor_id).
//
// The planner estimates an unnest at 100 rows and costs a nested loop into a partitioned
// table as a probe of every partition per key, since it does not count the partitions
// pruned at run time. So it hashes the keys and scans every partition whole: with 10,000
// sensors, a state batch's UPDATE of 67 rows took 2 ms instead of 0.4 ms, and it grows with
// the table. With hash and merge joins off for the transaction, each key is one index probe
// of the one partition that can hold it (the Append prunes the others per key).
//
// Only for batches of a bounded size whose every key is looked up (a state batch's
// sensors): a nested loop over many keys into an unindexed side would cost keys × rows.
package pgplan

import "github.com/jackc/pgx/v5"

// keyedSQL turns hash and merge joins off until the end of the transaction (set_config's
// is_local): one statement, so that it can be queued in a pipelined batch.
const keyedSQL = `SELECT set_config('enable_hashjoin', 'off', true), set_config('enable_mergejoin', 'off', true)`

// QueueKeyed queues, in a batch sent inside a transaction, the statement that makes the rest
// of the transaction join keys by index probes. Its result is read with ReadKeyed.
func QueueKeyed(b *pgx.Batch) { b.Queue(keyedSQL) }

// ReadKeyed reads the result of the statement QueueKeyed queued.
func ReadKeyed(br pgx.BatchResults) error {
	_, err := br.Exec()
	return err
}
