package pgtx

// GenericPlans, queued before statements in a transaction (or in a batch sent on a pool, its
// implicit transaction), makes them use their session's generic plan, with sequential scans
// off, until the transaction ends. For the look-ups that probe the hash-partitioned tables
// key by key: costed afresh at every call the planner kept choosing custom plans, whose
// planning (every partition considered) cost more than their execution, while the generic
// plan is made once per session and prunes the partitions at run time. Sequential scans are
// off so that a plan made while a table is nearly empty, and kept, still probes by index.
const GenericPlans = `SELECT set_config('plan_cache_mode', 'force_generic_plan', true), set_config('enable_seqscan', 'off', true)`
