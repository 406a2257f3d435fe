package history

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// The rows below are written straight into the tables the history projector writes, with the
// batch API and named columns as the projector does; duplicates stand for redelivered batches.

type testReading struct {
	sensor string
	seq    uint64
	data   uint8
	t      time.Time
}

func insertReadings(t *testing.T, ch driver.Conn, rs []testReading) {
	t.Helper()
	b, err := ch.PrepareBatch(t.Context(), "INSERT INTO readings (sensor_id, seq, data, time, time_ms, received, received_ms, message_id)")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		ms := r.t.UnixMilli()
		if err := b.Append(r.sensor, r.seq, r.data, time.Unix(ms/1000, 0), uint16(ms%1000), time.Unix(ms/1000+1, 0), uint16(ms%1000), fmt.Sprint("m", r.seq)); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Send(); err != nil {
		t.Fatal(err)
	}
}

type testEvent struct {
	sensor, typ string
	rev         uint64
	data        uint8
	t           time.Time
}

func insertEvents(t *testing.T, ch driver.Conn, es []testEvent) {
	t.Helper()
	b, err := ch.PrepareBatch(t.Context(), "INSERT INTO events (event_id, sensor_id, type, revision, data, previous_data, time, time_ms, seq)")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range es {
		ms := e.t.UnixMilli()
		var prev *uint8
		if e.typ == "state_changed" && e.rev > 1 {
			p := 1 - e.data
			prev = &p
		}
		if err := b.Append(fmt.Sprintf("evt_%s_%d", e.sensor, e.rev), e.sensor, e.typ, e.rev, e.data, prev,
			time.Unix(ms/1000, 0), uint16(ms%1000), e.rev); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Send(); err != nil {
		t.Fatal(err)
	}
}

var t0 = time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)

func TestReadingsPaging(t *testing.T) {
	t.Parallel()
	_, ch := testenv.ClickHouse(t)
	st, err := New(ch)
	if err != nil {
		t.Fatal(err)
	}
	// 100 readings of A, 333 ms apart (several share a second, two share a millisecond, and
	// the series crosses a month, i.e. a table partition), and readings of B in between.
	var a, all []testReading
	start := t0.Add(-10 * time.Second)
	for i := range 100 {
		at := start.Add(time.Duration(i) * 333 * time.Millisecond)
		if i == 51 {
			at = a[50].t // same millisecond: the stream sequence breaks the tie
		}
		r := testReading{sensor: "A", seq: uint64(1000 + 2*i), data: uint8(i % 2), t: at}
		a = append(a, r)
		all = append(all, r, testReading{sensor: "B", seq: uint64(1001 + 2*i), data: 1, t: at})
	}
	insertReadings(t, ch, all)
	insertReadings(t, ch, a[20:60]) // a redelivered batch
	insertReadings(t, ch, a[95:])

	pageAll := func(q Query) []uint64 {
		t.Helper()
		var got []uint64
		pages := 0
		for {
			p, err := st.Readings(t.Context(), "A", q)
			if err != nil {
				t.Fatal(err)
			}
			pages++
			if len(p.Readings) > q.PageSize || (p.NextPageToken != "" && len(p.Readings) != q.PageSize) {
				t.Fatalf("page %d has %d readings for page size %d (next %q)", pages, len(p.Readings), q.PageSize, p.NextPageToken)
			}
			for _, r := range p.Readings {
				if r.SensorID != "A" {
					t.Fatalf("reading of %s", r.SensorID)
				}
				got = append(got, r.Seq)
			}
			if p.NextPageToken == "" {
				return got
			}
			if pages > 100 {
				t.Fatal("paging does not end")
			}
			q.PageToken = p.NextPageToken
		}
	}
	seqs := func(rs []testReading) []uint64 {
		var s []uint64
		for _, r := range rs {
			s = append(s, r.seq)
		}
		return s
	}
	for _, tc := range []struct {
		name string
		q    Query
		want []uint64
	}{
		{"all by 7", Query{PageSize: 7}, seqs(a)},
		{"all by 7 newest first", Query{PageSize: 7, NewestFirst: true}, reversed(seqs(a))},
		{"range by 7", Query{PageSize: 7, Start: a[10].t, End: a[77].t}, seqs(a[10:77])},
		{"range by 7 newest first", Query{PageSize: 7, Start: a[10].t, End: a[77].t, NewestFirst: true}, reversed(seqs(a[10:77]))},
		{"one page", Query{PageSize: 1000}, seqs(a)},
		{"exactly one page", Query{PageSize: 100}, seqs(a)},
		{"start only", Query{PageSize: 7, Start: a[98].t}, seqs(a[98:])},
		{"end only", Query{PageSize: 7, End: a[3].t.Add(time.Millisecond)}, seqs(a[:4])},
		{"empty", Query{PageSize: 7, Start: t0.Add(time.Hour)}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := pageAll(tc.q); !slices.Equal(got, tc.want) {
				t.Fatalf("got %d readings %v\nwant %d %v", len(got), got, len(tc.want), tc.want)
			}
		})
	}

	// The values come back as written.
	p, err := st.Readings(t.Context(), "A", Query{PageSize: 2, Start: a[1].t})
	if err != nil {
		t.Fatal(err)
	}
	r := p.Readings[0]
	if !r.Time.Equal(a[1].t) || r.Data != 1 || !r.ReceivedTime.Equal(a[1].t.Add(time.Second)) || r.MessageID != "m1002" {
		t.Fatalf("reading %+v, want time %s data 1", r, a[1].t)
	}
}

func reversed[T any](s []T) []T {
	s = slices.Clone(s)
	slices.Reverse(s)
	return s
}

func TestInvalidQueries(t *testing.T) {
	t.Parallel()
	_, ch := testenv.ClickHouse(t)
	st, err := New(ch)
	if err != nil {
		t.Fatal(err)
	}
	insertReadings(t, ch, []testReading{{"A", 1, 1, t0}, {"A", 2, 0, t0.Add(time.Second)}, {"A", 3, 1, t0.Add(2 * time.Second)}})
	first, err := st.Readings(t.Context(), "A", Query{PageSize: 1})
	if err != nil || first.NextPageToken == "" {
		t.Fatalf("first page: %v %+v", err, first)
	}
	ctx := t.Context()
	for _, tc := range []struct {
		name  string
		call  func() error
		field string
	}{
		{"end before start", func() error {
			_, err := st.Readings(ctx, "A", Query{Start: t0, End: t0.Add(-time.Second)})
			return err
		}, "end_time"},
		{"end equals start", func() error {
			_, err := st.Events(ctx, "A", Query{Start: t0, End: t0})
			return err
		}, "end_time"},
		{"negative page size", func() error { _, err := st.Readings(ctx, "A", Query{PageSize: -1}); return err }, "page_size"},
		{"page size too big", func() error { _, err := st.Deliveries(ctx, "c", Query{PageSize: 1001}); return err }, "page_size"},
		{"garbage token", func() error { _, err := st.Readings(ctx, "A", Query{PageToken: "!!"}); return err }, "page_token"},
		{"token of another sensor", func() error {
			_, err := st.Readings(ctx, "B", Query{PageSize: 1, PageToken: first.NextPageToken})
			return err
		}, "page_token"},
		{"token of another order", func() error {
			_, err := st.Readings(ctx, "A", Query{PageSize: 1, PageToken: first.NextPageToken, NewestFirst: true})
			return err
		}, "page_token"},
		{"token of another list", func() error {
			_, err := st.Events(ctx, "A", Query{PageSize: 1, PageToken: first.NextPageToken})
			return err
		}, "page_token"},
		{"no sensor", func() error { _, err := st.Readings(ctx, "", Query{}); return err }, "sensor_id"},
		{"no client", func() error { _, err := st.Deliveries(ctx, "", Query{}); return err }, "client_id"},
		{"stats without start", func() error { _, err := st.Stats(ctx, "A", StatsQuery{End: t0}); return err }, "start_time"},
		{"stats end before start", func() error {
			_, err := st.Stats(ctx, "A", StatsQuery{Start: t0, End: t0.Add(-time.Hour)})
			return err
		}, "end_time"},
		{"stats interval too small", func() error {
			_, err := st.Stats(ctx, "A", StatsQuery{Start: t0, End: t0.Add(time.Hour), Interval: time.Millisecond})
			return err
		}, "interval"},
		{"stats too many intervals", func() error {
			_, err := st.Stats(ctx, "A", StatsQuery{Start: t0, End: t0.Add(365 * 24 * time.Hour), Interval: time.Minute})
			return err
		}, "interval"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			var ie *InvalidError
			if !errors.As(err, &ie) || !errors.Is(err, ErrInvalid) {
				t.Fatalf("got %v, want an InvalidError", err)
			}
			if ie.Field != tc.field {
				t.Fatalf("error names %q (%v), want %q", ie.Field, err, tc.field)
			}
		})
	}
	// The token still works where it belongs.
	next, err := st.Readings(ctx, "A", Query{PageSize: 1, PageToken: first.NextPageToken})
	if err != nil || len(next.Readings) != 1 || next.Readings[0].Seq != 2 {
		t.Fatalf("second page: %v %+v", err, next)
	}
}

func TestStats(t *testing.T) {
	t.Parallel()
	_, ch := testenv.ClickHouse(t)
	st, err := New(ch)
	if err != nil {
		t.Fatal(err)
	}
	at := func(d string) time.Time {
		x, err := time.ParseDuration(d)
		if err != nil {
			t.Fatal(err)
		}
		return t0.Add(x)
	}
	// The sensor's story from t0, by revision:
	//   -30m  closed (first reading ever)
	//   +30m  open
	//   +1h30 connection lost (last state open)
	//   +2h15 restored by a closed reading: connection_restored then state_changed
	//   +3h45 open
	// and another sensor's events that must not count.
	evs := []testEvent{
		{"S", "state_changed", 1, 1, at("-30m")},
		{"S", "state_changed", 2, 0, at("30m")},
		{"S", "connection_lost", 3, 0, at("1h30m")},
		{"S", "connection_restored", 4, 1, at("2h15m")},
		{"S", "state_changed", 5, 1, at("2h15m")},
		{"S", "state_changed", 6, 0, at("3h45m")},
		{"T", "connection_lost", 9, 0, at("10m")},
	}
	insertEvents(t, ch, evs)
	insertEvents(t, ch, evs[2:5]) // redelivered
	var rs []testReading
	seq := uint64(0)
	for _, d := range []string{"-40m", "-30m", "1m", "30m", "59m59.999s", "2h15m", "2h20m", "3h", "3h10m", "3h20m", "3h45m", "3h59m", "4h"} {
		seq++
		rs = append(rs, testReading{"S", seq, 1, at(d)})
	}
	insertReadings(t, ch, rs)
	insertReadings(t, ch, rs[5:9]) // redelivered
	insertReadings(t, ch, []testReading{{"T", 100, 1, at("1m")}})

	type want struct {
		readings, changes  int64
		closed, open, lost string
	}
	for _, tc := range []struct {
		name   string
		q      StatsQuery
		now    time.Time
		starts []string
		want   []want
	}{
		{"hourly", StatsQuery{Start: t0, End: at("4h"), Interval: time.Hour}, at("100h"),
			[]string{"0s", "1h", "2h", "3h"},
			[]want{
				{3, 1, "30m", "30m", "0s"},
				{0, 0, "0s", "30m", "30m"},
				{2, 1, "45m", "0s", "15m"},
				{5, 1, "45m", "15m", "0s"},
			}},
		{"90 minutes, last interval short", StatsQuery{Start: t0, End: at("4h"), Interval: 90 * time.Minute}, at("100h"),
			[]string{"0s", "1h30m", "3h"},
			[]want{
				{3, 1, "30m", "1h", "0s"},
				{2, 1, "45m", "0s", "45m"},
				{5, 1, "45m", "15m", "0s"},
			}},
		{"ends at now", StatsQuery{Start: at("2h"), Interval: time.Hour}, at("3h30m"),
			[]string{"2h", "3h"},
			[]want{
				{2, 1, "45m", "0s", "15m"},
				{3, 0, "30m", "0s", "0s"},
			}},
		// Rows are counted where they are (here "now" is a fiction); time spans stop at now.
		{"time after now not counted", StatsQuery{Start: at("3h"), End: at("5h"), Interval: time.Hour}, at("3h30m"),
			[]string{"3h", "4h"},
			[]want{
				{5, 1, "30m", "0s", "0s"},
				{1, 0, "0s", "0s", "0s"},
			}},
		{"before the first event", StatsQuery{Start: at("-1h"), End: at("0s"), Interval: 20 * time.Minute}, at("100h"),
			[]string{"-1h", "-40m", "-20m"},
			[]want{
				{0, 0, "0s", "0s", "0s"},
				{2, 1, "10m", "0s", "0s"},
				{0, 0, "20m", "0s", "0s"},
			}},
		{"default interval, lost across the whole range", StatsQuery{Start: at("1h40m"), End: at("2h10m")}, at("100h"),
			[]string{"1h40m"},
			[]want{{0, 0, "0s", "0s", "30m"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := *st
			s.now = func() time.Time { return tc.now }
			got, err := s.Stats(t.Context(), "S", tc.q)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("got %d intervals %+v, want %d", len(got), got, len(tc.want))
			}
			for i, w := range tc.want {
				g := got[i]
				d := func(s string) time.Duration { x, _ := time.ParseDuration(s); return x }
				if !g.Start.Equal(at(tc.starts[i])) || g.Readings != w.readings || g.StateChanges != w.changes ||
					g.Closed != d(w.closed) || g.Open != d(w.open) || g.Lost != d(w.lost) {
					t.Errorf("interval %d: got start %s readings %d changes %d closed %s open %s lost %s\n"+
						"want start %s readings %d changes %d closed %s open %s lost %s", i,
						g.Start.Sub(t0), g.Readings, g.StateChanges, g.Closed, g.Open, g.Lost,
						tc.starts[i], w.readings, w.changes, w.closed, w.open, w.lost)
				}
			}
		})
	}
}

func TestEventsAndDeliveries(t *testing.T) {
	t.Parallel()
	_, ch := testenv.ClickHouse(t)
	st, err := New(ch)
	if err != nil {
		t.Fatal(err)
	}
	var evs []testEvent
	for i := range 30 {
		evs = append(evs, testEvent{"S", "state_changed", uint64(i + 1), uint8(i % 2), t0.Add(time.Duration(i/3) * time.Second)})
	}
	insertEvents(t, ch, evs)
	insertEvents(t, ch, evs[5:12])
	var ids []string
	q := Query{PageSize: 4}
	for {
		p, err := st.Events(t.Context(), "S", q)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range p.Events {
			ids = append(ids, fmt.Sprint(e.Revision))
			if e.Type != "state_changed" || e.SensorID != "S" || (e.Revision > 1) != (e.PreviousData != nil) {
				t.Fatalf("event %+v", e)
			}
		}
		if q.PageToken = p.NextPageToken; q.PageToken == "" {
			break
		}
	}
	if len(ids) != 30 || len(slices.Compact(slices.Sorted(slices.Values(ids)))) != 30 {
		t.Fatalf("events: %v", ids)
	}

	b, err := ch.PrepareBatch(t.Context(), "INSERT INTO deliveries (event_id, client_id, sensor_id, attempt, time, time_ms, status_code, latency_ms, error, outcome)")
	if err != nil {
		t.Fatal(err)
	}
	type key struct {
		sec int
		ev  string
		att uint16
	}
	var want []key
	for rep := range 2 { // the second pass is a redelivery
		for i := range 25 {
			k := key{i / 10, fmt.Sprintf("evt_%02d", i%5), uint16(i/5 + 1)}
			if rep == 0 {
				want = append(want, k)
			}
			if err := b.Append(k.ev, "C", "S", k.att, t0.Add(time.Duration(i/10)*time.Second), uint16(0), uint16(500), uint32(12), "HTTP 500", "retry"); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := b.Append("evt_x", "D", "S", uint16(1), t0, uint16(0), uint16(200), uint32(3), "", "delivered"); err != nil {
		t.Fatal(err)
	}
	if err := b.Send(); err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(want, func(a, b key) int {
		if a.sec != b.sec {
			return a.sec - b.sec
		}
		if a.ev != b.ev {
			return strings.Compare(a.ev, b.ev)
		}
		return int(a.att) - int(b.att)
	})
	var got []key
	q = Query{PageSize: 3, NewestFirst: true}
	for {
		p, err := st.Deliveries(t.Context(), "C", q)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range p.Deliveries {
			if d.ClientID != "C" || d.StatusCode != 500 || d.Latency != 12*time.Millisecond || d.Outcome != "retry" {
				t.Fatalf("delivery %+v", d)
			}
			got = append(got, key{int(d.Time.Sub(t0) / time.Second), d.EventID, uint16(d.Attempt)})
		}
		if q.PageToken = p.NextPageToken; q.PageToken == "" {
			break
		}
	}
	if !slices.Equal(got, reversed(want)) {
		t.Fatalf("deliveries newest first:\n got %v\nwant %v", got, reversed(want))
	}
}

func FuzzPageToken(f *testing.F) {
	f.Add(encodePageToken(pageToken{Q: "abc", T: 5, S: 7}))
	f.Add(encodePageToken(pageToken{Q: "abc", T: 5, ID: "evt_'x"}))
	f.Add("")
	f.Add("e30")
	f.Fuzz(func(t *testing.T, s string) {
		tok, err := decodePageToken(s)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v is not ErrInvalid", err)
			}
			return
		}
		if tok.Q == "" || tok.T < 0 {
			t.Fatalf("accepted %+v", tok)
		}
		// A token that decodes re-encodes to one that decodes the same.
		again, err := decodePageToken(encodePageToken(tok))
		if err != nil || again != tok {
			t.Fatalf("round trip %+v -> %+v, %v", tok, again, err)
		}
	})
}

// After a NATS store loss and a rebase of the checkpoints, READINGS numbers from 1 again: a
// new reading whose sequence equals an old one's is another reading (its receive time says
// so), listed and counted beside the old one, while a redelivered row still counts once.
func TestReadingsAfterRebaseShowEveryNewReading(t *testing.T) {
	t.Parallel()
	_, ch := testenv.ClickHouse(t)
	st, err := New(ch)
	if err != nil {
		t.Fatal(err)
	}
	var old, fresh []testReading
	for i := range 5 {
		old = append(old, testReading{sensor: "R", seq: uint64(1 + i), data: uint8(i % 2), t: t0.Add(time.Duration(i) * time.Second)})
		fresh = append(fresh, testReading{sensor: "R", seq: uint64(1 + i), data: uint8(1 - i%2), t: t0.Add(time.Hour + time.Duration(i)*time.Second)})
	}
	insertReadings(t, ch, old)
	insertReadings(t, ch, fresh)
	insertReadings(t, ch, old[2:]) // a redelivered batch of the old stream
	p, err := st.Readings(t.Context(), "R", Query{Start: t0.Add(-time.Minute), End: t0.Add(2 * time.Hour), PageSize: 100})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range p.Readings {
		got = append(got, fmt.Sprintf("%d/%d", r.Seq, r.Data))
	}
	if want := "[1/0 2/1 3/0 4/1 5/0 1/1 2/0 3/1 4/0 5/1]"; fmt.Sprint(got) != want {
		t.Fatalf("readings %v, want %s", got, want)
	}
	ivs, err := st.Stats(t.Context(), "R", StatsQuery{Start: t0.Add(-time.Minute), End: t0.Add(2 * time.Hour), Interval: 3 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if len(ivs) != 1 || ivs[0].Readings != 10 {
		t.Fatalf("stats %+v, want one interval of 10 readings", ivs)
	}
}
