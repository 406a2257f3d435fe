package history

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// BenchmarkLastReadings measures "the last 100 readings of one sensor" with 10,000,000 rows
// in the readings table (1,000 sensors × 10,000 readings, generated inside ClickHouse), and
// reports the p50 and p99 of 200 queries over random sensors.
func BenchmarkLastReadings(b *testing.B) {
	_, ch := testenv.ClickHouse(b)
	const rows, sensors = 10_000_000, 1000
	start := time.Now()
	err := ch.Exec(b.Context(), fmt.Sprintf(`INSERT INTO readings (sensor_id, seq, data, time, time_ms, received, received_ms, message_id)
SELECT concat('s', toString(number %% %d)), number, toUInt8(number %% 2),
    toDateTime(1767225600 + intDiv(number, %d) * 600), toUInt16(number %% 1000),
    toDateTime(1767225601 + intDiv(number, %d) * 600), toUInt16(number %% 1000), concat('m', toString(number))
FROM numbers(%d)`, sensors, sensors, sensors, rows))
	if err != nil {
		b.Fatal(err)
	}
	var n uint64
	if err := ch.QueryRow(b.Context(), "SELECT count() FROM readings").Scan(&n); err != nil || n != rows {
		b.Fatalf("%d rows, %v", n, err)
	}
	b.Logf("generated %d rows in %s", n, time.Since(start).Round(time.Millisecond))
	st, _ := New(ch)
	for b.Loop() {
		var lat []time.Duration
		for i := range 200 {
			s := fmt.Sprintf("s%d", (i*7919)%sensors)
			t := time.Now()
			p, err := st.Readings(b.Context(), s, Query{PageSize: 100, NewestFirst: true})
			lat = append(lat, time.Since(t))
			if err != nil || len(p.Readings) != 100 {
				b.Fatalf("%s: %d readings, %v", s, len(p.Readings), err)
			}
		}
		slices.Sort(lat)
		b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
		b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
	}
}
