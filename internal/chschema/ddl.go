package chschema

import (
	"fmt"
	"regexp"
	"strings"
)

// Layout is where the history tables live: one ClickHouse node, or a cluster.
type Layout struct {
	// Cluster is the cluster (of the servers' remote_servers) the tables span; empty is one
	// node, the schema the SQL migrations build.
	Cluster string
	// Database holds the tables; a cluster's statements name it, since they run on every node.
	Database string
}

var identifier = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// ValidName says whether s can name a cluster or database in the rendered DDL unquoted.
func ValidName(s string) error {
	if !identifier.MatchString(s) {
		return fmt.Errorf("%q: must be letters, digits and _, not starting with a digit", s)
	}
	return nil
}

// LocalSuffix names a cluster's replicated table on each shard; the Distributed table over
// them keeps the table's own name, so every query and INSERT stays as it is.
const LocalSuffix = "_local"

// ShardKey spreads rows over a cluster's shards by sensor: a sensor's rows, and the
// duplicates ReplacingMergeTree collapses, are all on one shard.
const ShardKey = "sipHash64(sensor_id)"

// Create is the DDL that makes t in l, repeatable (IF NOT EXISTS). One node: the table
// itself. A cluster: t + LocalSuffix, replicated, on every node (ON CLUSTER), with the
// servers' {shard} and {replica} macros in its ZooKeeper path, and the Distributed table t
// over them; a table made Everywhere is t itself, replicated to every node under one path.
func (t Table) Create(l Layout) []string {
	keys := " ORDER BY " + t.OrderBy
	if t.PartitionBy != "" {
		keys = " PARTITION BY " + t.PartitionBy + keys
	}
	version := ""
	if t.Version != "" {
		version = ", " + t.Version
	}
	if l.Cluster == "" {
		return []string{"CREATE TABLE IF NOT EXISTS " + t.Name + " " + t.columnsDDL() +
			" ENGINE = " + t.Engine + "(" + t.Version + ")" + keys}
	}
	on := " ON CLUSTER " + l.Cluster
	if t.Everywhere {
		path := fmt.Sprintf("'/clickhouse/tables/%s/%s'", l.Database, t.Name)
		return []string{"CREATE TABLE IF NOT EXISTS " + l.Database + "." + t.Name + on + " " + t.columnsDDL() +
			" ENGINE = Replicated" + t.Engine + "(" + path + ", '{replica}'" + version + ")" + keys}
	}
	local := l.Database + "." + t.Name + LocalSuffix
	path := fmt.Sprintf("'/clickhouse/tables/{shard}/%s/%s%s'", l.Database, t.Name, LocalSuffix)
	return []string{
		"CREATE TABLE IF NOT EXISTS " + local + on + " " + t.columnsDDL() +
			" ENGINE = Replicated" + t.Engine + "(" + path + ", '{replica}'" + version + ")" + keys,
		"CREATE TABLE IF NOT EXISTS " + l.Database + "." + t.Name + on + " AS " + local +
			fmt.Sprintf(" ENGINE = Distributed(%s, %s, %s%s, %s)", l.Cluster, l.Database, t.Name, LocalSuffix, ShardKey),
	}
}

// Create is the DDL of every history table in l, and of Positions.
func Create(l Layout) []string {
	var out []string
	for _, t := range append(Tables[:len(Tables):len(Tables)], Positions) {
		out = append(out, t.Create(l)...)
	}
	return out
}

func (t Table) columnsDDL() string {
	cols := make([]string, len(t.Columns))
	for i, c := range t.Columns {
		cols[i] = c.Name + " " + c.Type
		if d, ok := t.Defaults[c.Name]; ok {
			cols[i] += " DEFAULT " + d
		}
	}
	return "(" + strings.Join(cols, ", ") + ")"
}
