package state

// keyedJoins, queued first in a batch's transaction, keeps the planner on index probes for the
// statements that join the batch's sensors (an unnest of parameters) to the hash-partitioned
// sensor_state, until the end of the transaction (set_config's is_local; one statement, so
// that it goes in the pipelined batch).
//
// The planner estimates an unnest at 100 rows and costs a nested loop into a partitioned
// table as a probe of every partition per key, since it does not count the partitions
// pruned at run time. So it hashes the keys and scans every partition whole, several times
// slower than probing for a batch's keys, and slower as the table grows. With hash and merge joins off for the transaction, each key is one index probe
// of the one partition that can hold it (the Append prunes the others per key).
//
// Only for batches of a bounded size whose every key is looked up: a nested loop over many
// keys into an unindexed side would cost keys × rows (the notifier keeps hash joins).
// pgtx.GenericPlans goes with it, for the row look-up and the UPDATE.
const keyedJoins = `SELECT set_config('enable_hashjoin', 'off', true), set_config('enable_mergejoin', 'off', true)`
