package migrations_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/lock-sensors/lock-sensors/internal/chschema"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// The migrated history tables and the positions table (system.columns lists them in table order: 18.16 has no
// position column) have exactly the columns internal/chschema lists, in its order
// and with its types: the writer, its rebuild and the reader build their SQL from that list,
// so a column changed in one place and not the other fails here.
func TestClickHouseTablesMatchSchema(t *testing.T) {
	t.Parallel()
	_, ch := testenv.ClickHouse(t)
	for _, tb := range append(slices.Clone(chschema.Tables), chschema.Positions) {
		rows, err := ch.Query(t.Context(), `SELECT name, type FROM system.columns WHERE database = currentDatabase() AND table = ?`, tb.Name)
		if err != nil {
			t.Fatal(err)
		}
		var got []chschema.Column
		for rows.Next() {
			var c chschema.Column
			if err := rows.Scan(&c.Name, &c.Type); err != nil {
				t.Fatal(err)
			}
			got = append(got, c)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, tb.Columns) {
			t.Errorf("table %s after the migrations:\n%v\nchschema lists\n%v", tb.Name, got, tb.Columns)
		}
	}
}

// The single-node DDL internal/chschema renders makes the very tables the SQL migrations
// make (ClickHouse's own normalised CREATE, database name aside): the cluster variant is
// rendered from the same definition, so it cannot drift from what runs here.
func TestClickHouseRenderedSchemaIsMigrated(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	_, migrated := testenv.ClickHouse(t)
	name := testenv.Name("locks_render")
	admin, err := clickhouse.Open(&clickhouse.Options{Addr: []string{testenv.ClickHouseAddr()}})
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	exec(t, admin, "CREATE DATABASE "+name)
	t.Cleanup(func() { testenv.DropClickHouseDatabase(t, name) })
	rendered, err := clickhouse.Open(&clickhouse.Options{Addr: []string{testenv.ClickHouseAddr()}, Auth: clickhouse.Auth{Database: name}})
	if err != nil {
		t.Fatal(err)
	}
	defer rendered.Close()
	for _, st := range chschema.Create(chschema.Layout{Database: name}) {
		exec(t, rendered, st)
	}
	create := func(conn driver.Conn, table string) string {
		var db, q string
		if err := conn.QueryRow(ctx, "SELECT database, create_table_query FROM system.tables WHERE database = currentDatabase() AND name = '"+table+"'").Scan(&db, &q); err != nil {
			t.Fatalf("%s: %v", table, err)
		}
		return strings.ReplaceAll(q, db+".", "")
	}
	for _, tb := range append(slices.Clone(chschema.Tables), chschema.Positions) {
		if m, r := create(migrated, tb.Name), create(rendered, tb.Name); m != r {
			t.Errorf("%s:\nmigrated %s\nrendered %s", tb.Name, m, r)
		}
	}
}
