package chschema

import "testing"

func TestInsertNamesEveryColumnInOrder(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		t    Table
		want string
	}{
		{Readings, "INSERT INTO readings (sensor_id, seq, data, time, time_ms, received, received_ms, message_id)"},
		{Events, "INSERT INTO events_rebuild (event_id, sensor_id, type, revision, data, previous_data, time, time_ms, seq, received, received_ms)"},
		{Deliveries, "INSERT INTO deliveries (event_id, client_id, sensor_id, attempt, time, time_ms, status_code, latency_ms, error, outcome)"},
	} {
		table := c.t.Name
		if c.t.Name == "events" {
			table = "events_rebuild"
		}
		if got := c.t.Insert(table); got != c.want {
			t.Errorf("%s: %q, want %q", c.t.Name, got, c.want)
		}
	}
}

func TestSelectRefusesUnknownColumns(t *testing.T) {
	t.Parallel()
	if got := Readings.Select("seq", "toUInt32(time)", "message_id"); got != "seq, toUInt32(time), message_id" {
		t.Errorf("Select: %q", got)
	}
	for _, bad := range []string{"nope", "toUInt32(nope)", "revision"} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Select(%q) on readings did not panic", bad)
				}
			}()
			Readings.Select(bad)
		}()
	}
}
