package history

import "testing"

// Each table's columns builds exactly one slice per column of its chschema definition, which
// its INSERT names in the same order.
func TestTablesBuildEveryColumn(t *testing.T) {
	t.Parallel()
	for _, tb := range tables {
		if got, want := len(tb.columns(nil)), len(tb.schema.Columns); got != want {
			t.Errorf("%s: %d column slices, chschema lists %d columns", tb.name, got, want)
		}
	}
}
