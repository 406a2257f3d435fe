package history

import (
	"context"
	"fmt"
	"time"
)

// StatsQuery asks for a sensor's statistics from Start (inclusive, required) to End
// (exclusive; zero means now), cut into intervals of Interval (default 1 h) aligned on Start;
// the last interval ends at End.
type StatsQuery struct {
	Start, End time.Time
	Interval   time.Duration
}

// Interval holds one interval's statistics.
//
// Readings counts the readings whose time is in the interval; StateChanges the state_changed
// events. Closed, Open and Lost split the interval by the sensor's state as its events tell it
// (each event carries the state after it): Lost while the connection is lost, else Closed or
// Open by the last data. Time before the sensor's first event, and time after now, is in none
// of them, so Closed+Open+Lost is at most End-Start.
type Interval struct {
	Start, End         time.Time
	Readings           int64
	StateChanges       int64
	Closed, Open, Lost time.Duration
}

// Stats computes a sensor's statistics per interval in ClickHouse.
func (s *Store) Stats(ctx context.Context, sensorID string, q StatsQuery) ([]Interval, error) {
	if err := checkID("sensor_id", sensorID); err != nil {
		return nil, err
	}
	w, err := q.window(s.now())
	if err != nil {
		return nil, err
	}
	out := w.intervals()
	if err := s.statsCounts(ctx, sensorID, w, out); err != nil {
		return nil, err
	}
	if w.spanEnd <= w.start {
		return out, nil
	}
	if err := s.statsSpans(ctx, sensorID, w, out); err != nil {
		return nil, err
	}
	return out, nil
}

// statsWindow is a checked StatsQuery in Unix milliseconds: n intervals of step from start,
// the last one ending at end. Time spans stop at spanEnd: the future is not yet closed,
// open or lost.
type statsWindow struct {
	start, end, spanEnd, step, n int64
}

// window checks q, with now for a zero End, and says its intervals.
func (q StatsQuery) window(now time.Time) (statsWindow, error) {
	if q.Start.IsZero() {
		return statsWindow{}, invalid("start_time", "required")
	}
	end := q.End
	if end.IsZero() {
		end = now
	}
	if !end.After(q.Start) {
		return statsWindow{}, invalid("end_time", "must be after start_time (%s), got %s",
			q.Start.UTC().Format(time.RFC3339Nano), end.UTC().Format(time.RFC3339Nano))
	}
	iv := q.Interval
	if iv == 0 {
		iv = time.Hour
	}
	if iv < time.Second || iv%time.Millisecond != 0 {
		return statsWindow{}, invalid("interval", "must be a whole number of milliseconds, at least 1s, got %s", iv)
	}
	w := statsWindow{start: clampMS(q.Start), end: clampMS(end), step: iv.Milliseconds()}
	if w.end <= w.start {
		return statsWindow{}, invalid("start_time", "outside the stored time range")
	}
	w.n = (w.end - w.start + w.step - 1) / w.step
	if w.n > MaxIntervals {
		return statsWindow{}, invalid("interval", "%s cuts the range into %d intervals; at most %d", iv, w.n, MaxIntervals)
	}
	w.spanEnd = min(w.end, clampMS(now))
	return w, nil
}

// intervals are the window's intervals, their statistics still zero.
func (w statsWindow) intervals() []Interval {
	out := make([]Interval, w.n)
	for k := range out {
		out[k].Start = time.UnixMilli(w.start + int64(k)*w.step).UTC()
		out[k].End = time.UnixMilli(min(w.start+int64(k+1)*w.step, w.end)).UTC()
	}
	return out
}

// statsCounts fills in each interval's readings and state changes.
func (s *Store) statsCounts(ctx context.Context, sensorID string, w statsWindow, out []Interval) error {
	S, E0, I := w.start, w.end, w.step
	in := fmt.Sprintf("sensor_id = %s AND time >= toDateTime(%d) AND time <= toDateTime(%d) AND %s >= %d AND %s < %d",
		quote(sensorID), S/1000, (E0-1)/1000, tmsExpr, S, tmsExpr, E0)
	counts := func(what, sql string, set func(iv *Interval, v uint64)) error {
		rows, err := s.ch.Query(ctx, sql)
		if err != nil {
			return fmt.Errorf("history: stats of %s: %s: %w", sensorID, what, err)
		}
		defer rows.Close()
		for rows.Next() {
			var k int64
			var v uint64
			if err := rows.Scan(&k, &v); err != nil {
				return fmt.Errorf("history: stats of %s: %s: %w", sensorID, what, err)
			}
			if k >= 0 && k < w.n {
				set(&out[k], v)
			}
		}
		if err := rows.Err(); err != nil {
			return fmt.Errorf("history: stats of %s: %s: %w", sensorID, what, err)
		}
		return nil
	}
	bucket := fmt.Sprintf("toInt64(intDiv(%s - %d, %d))", tmsExpr, S, I)
	if err := counts("readings", "SELECT "+bucket+" AS k, toUInt64(uniqExact(seq, received, received_ms)) FROM readings WHERE "+in+" GROUP BY k",
		func(iv *Interval, v uint64) { iv.Readings = int64(v) }); err != nil {
		return err
	}
	return counts("state changes", "SELECT "+bucket+" AS k, toUInt64(uniqExact(event_id)) FROM events WHERE "+in+
		" AND type = 'state_changed' GROUP BY k",
		func(iv *Interval, v uint64) { iv.StateChanges = int64(v) })
}

// statsSpans fills in how long each interval the sensor was closed, open and lost.
func (s *Store) statsSpans(ctx context.Context, sensorID string, w statsWindow, out []Interval) error {
	rows, err := s.ch.Query(ctx, spansSQL(quote(sensorID), w))
	if err != nil {
		return fmt.Errorf("history: stats of %s: time spans: %w", sensorID, err)
	}
	defer rows.Close()
	for rows.Next() {
		var k int64
		var closed, open, lost uint64
		if err := rows.Scan(&k, &closed, &open, &lost); err != nil {
			return fmt.Errorf("history: stats of %s: time spans: %w", sensorID, err)
		}
		if k >= 0 && k < w.n {
			out[k].Closed = time.Duration(closed) * time.Millisecond
			out[k].Open = time.Duration(open) * time.Millisecond
			out[k].Lost = time.Duration(lost) * time.Millisecond
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("history: stats of %s: time spans: %w", sensorID, err)
	}
	return nil
}

// spansSQL is the query of the closed, open and lost milliseconds per interval k of the
// sensor (quoted).
//
// The state timeline: the last event before the start (the state at the start) and the
// events in [start, spanEnd), de-duplicated, ordered by revision (the sensor's own event
// order; times from sensor clocks and server clocks may interleave). Segment i runs from
// event i to event i+1 (or spanEnd) with event i's state; each segment is cut at interval
// edges and summed per interval.
func spansSQL(sensor string, w statsWindow) string {
	S, E, I := w.start, w.spanEnd, w.step
	const typed = "type IN ('state_changed', 'connection_lost', 'connection_restored')"
	timeline := fmt.Sprintf(`
SELECT
    arraySort((x, r) -> r, groupArray(tms), groupArray(rev)) AS ts,
    arraySort((x, r) -> r, groupArray(d), groupArray(rev)) AS ds,
    arraySort((x, r) -> r, groupArray(l), groupArray(rev)) AS ls
FROM (
    SELECT toInt64(%[1]s) AS tms, toUInt64(revision) AS rev, toUInt8(data) AS d, toUInt8(type = 'connection_lost') AS l
    FROM events
    WHERE sensor_id = %[2]s AND %[3]s AND time <= toDateTime(%[4]d) AND %[1]s < %[5]d
    ORDER BY revision DESC LIMIT 1
    UNION ALL
    SELECT toInt64(any(%[1]s)) AS tms, toUInt64(any(revision)) AS rev, toUInt8(any(data)) AS d, toUInt8(any(type = 'connection_lost')) AS l
    FROM events
    WHERE sensor_id = %[2]s AND %[3]s AND time >= toDateTime(%[6]d) AND time <= toDateTime(%[7]d) AND %[1]s >= %[5]d AND %[1]s < %[8]d
    GROUP BY event_id
)`, tmsExpr, sensor, typed, S/1000, S, S/1000, (E-1)/1000, E)
	segments := fmt.Sprintf(`
SELECT arrayJoin(arrayEnumerate(ts)) AS i,
    greatest(ts[i], toInt64(%[1]d)) AS f,
    least(if(i < length(ts), greatest(ts[i + 1], ts[i]), toInt64(%[2]d)), toInt64(%[2]d)) AS t,
    ds[i] AS d, ls[i] AS l
FROM (%[3]s)`, S, E, timeline)
	return fmt.Sprintf(`
SELECT k,
    toUInt64(sumIf(ov, l = 0 AND d = 1)) AS closed,
    toUInt64(sumIf(ov, l = 0 AND d = 0)) AS open,
    toUInt64(sumIf(ov, l = 1)) AS lost
FROM (
    SELECT d, l,
        arrayJoin(arrayMap(x -> toInt64(x) + intDiv(f - %[1]d, %[2]d), range(toUInt64(intDiv(t - 1 - %[1]d, %[2]d) - intDiv(f - %[1]d, %[2]d) + 1)))) AS k,
        least(t, %[1]d + (k + 1) * %[2]d) - greatest(f, %[1]d + k * %[2]d) AS ov
    FROM (%[3]s)
    WHERE t > f
)
GROUP BY k`, S, I, segments)
}
