package migrations_test

import (
	"slices"
	"testing"

	"github.com/lock-sensors/lock-sensors/internal/chschema"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// The migrated history tables (system.columns lists them in table order: 18.16 has no
// position column) have exactly the columns internal/chschema lists, in its order
// and with its types: the writer, its rebuild and the reader build their SQL from that list,
// so a column changed in one place and not the other fails here.
func TestClickHouseTablesMatchSchema(t *testing.T) {
	t.Parallel()
	_, ch := testenv.ClickHouse(t)
	for _, tb := range chschema.Tables {
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
