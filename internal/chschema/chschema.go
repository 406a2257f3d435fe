// Package chschema is the one definition of the history tables in ClickHouse (and of the
// history projector's positions table): their names and columns, in the order the writer's
// INSERTs list them. The history projector, its rebuild and
// the history reader build their column lists from it, so that a column change is an edit here
// plus a migration (migrations/clickhouse), which a test holds to this definition.
package chschema

import (
	"fmt"
	"strings"
)

// Column is one column of a table, with its ClickHouse type as system.columns shows it.
type Column struct {
	Name, Type string
}

// Table is a history table: its columns, and the engine keys both layouts share (ddl.go).
type Table struct {
	Name    string
	Columns []Column
	// Defaults are DEFAULT expressions by column, for rows copied from an older schema.
	Defaults map[string]string
	// Engine is the single-node MergeTree engine; a cluster uses its Replicated twin.
	Engine string
	// Version is the engine's version column (ReplacingMergeTree keeps the row with the
	// highest); empty for none.
	Version     string
	PartitionBy string
	OrderBy     string
	// Everywhere: on a cluster, one replicated table whose every node holds all of it
	// (one ZooKeeper path, no shard, no Distributed table over it), for a few rows that any
	// node must read whole.
	Everywhere bool
}

// The history tables.
var (
	Readings = Table{Name: "readings", Columns: []Column{
		{"sensor_id", "String"}, {"seq", "UInt64"}, {"data", "UInt8"},
		{"time", "DateTime"}, {"time_ms", "UInt16"},
		{"received", "DateTime"}, {"received_ms", "UInt16"},
		{"message_id", "String"},
	},
		// Collapses a redelivered or replayed reading; partitioned by receive time, never by
		// the sensor's clock (docs/contract.md, "Sensor clocks").
		Engine: "ReplacingMergeTree", PartitionBy: "toYYYYMM(received)",
		OrderBy: "(sensor_id, received, received_ms, seq)"}
	Events = Table{Name: "events", Columns: []Column{
		{"event_id", "String"}, {"sensor_id", "String"}, {"type", "String"}, {"revision", "UInt64"},
		{"data", "UInt8"}, {"previous_data", "Nullable(UInt8)"},
		{"time", "DateTime"}, {"time_ms", "UInt16"}, {"seq", "UInt64"},
		{"received", "DateTime"}, {"received_ms", "UInt16"},
	},
		Defaults: map[string]string{"received": "time", "received_ms": "time_ms"},
		Engine:   "ReplacingMergeTree", PartitionBy: "toYYYYMM(received)",
		OrderBy: "(sensor_id, received, received_ms, revision, event_id)"}
	Deliveries = Table{Name: "deliveries", Columns: []Column{
		{"event_id", "String"}, {"client_id", "String"}, {"sensor_id", "String"}, {"attempt", "UInt16"},
		{"time", "DateTime"}, {"time_ms", "UInt16"}, {"status_code", "UInt16"}, {"latency_ms", "UInt32"},
		{"error", "String"}, {"outcome", "String"},
	},
		Engine: "ReplacingMergeTree", PartitionBy: "toYYYYMM(time)",
		OrderBy: "(client_id, time, time_ms, event_id, attempt)"}
)

// Positions is where the history projector resumes each of its consumers: source names the
// consumer, stream the stream's identity (its creation time), seq the last stream sequence
// whose message is written (every message of source up to it is). Written after the rows, in
// one small INSERT per batch; the newest row of a source wins (written is unix nanoseconds).
// Not a history table: no rebuild swaps it, no retention drops it.
var Positions = Table{Name: "history_positions", Columns: []Column{
	{"source", "String"}, {"stream", "String"}, {"seq", "UInt64"}, {"written", "UInt64"},
},
	Engine: "ReplacingMergeTree", Version: "written", OrderBy: "source", Everywhere: true}

// Tables are the history tables, in the order the projector writes them.
var Tables = []Table{Readings, Events, Deliveries}

// Names are t's column names, in order.
func (t Table) Names() []string {
	out := make([]string, len(t.Columns))
	for i, c := range t.Columns {
		out[i] = c.Name
	}
	return out
}

// List is t's column names joined for an INSERT or a SELECT.
func (t Table) List() string { return strings.Join(t.Names(), ", ") }

// Insert is the INSERT of every column of t into table (t's own name, or that of a copy such
// as a rebuild's shadow). ClickHouse 18.16 wants the columns named.
func (t Table) Insert(table string) string {
	return "INSERT INTO " + table + " (" + t.List() + ")"
}

// Select joins items for a SELECT of t: each is a column of t, or a function of one
// (`toUInt32(time)`). It panics on a column t does not have, so that a reader built at
// package initialisation fails at once, not at its first query.
func (t Table) Select(items ...string) string {
	for _, it := range items {
		name := it
		if i := strings.LastIndexByte(it, '('); i >= 0 {
			name = strings.TrimSuffix(it[i+1:], ")")
		}
		if !t.Has(name) {
			panic(fmt.Sprintf("chschema: %s has no column %q (in %q)", t.Name, name, it))
		}
	}
	return strings.Join(items, ", ")
}

// Has says whether t has a column name.
func (t Table) Has(name string) bool {
	for _, c := range t.Columns {
		if c.Name == name {
			return true
		}
	}
	return false
}
