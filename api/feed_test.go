package api

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"google.golang.org/grpc/metadata"

	"github.com/lock-sensors/lock-sensors/internal/event"
	locksv1 "github.com/lock-sensors/lock-sensors/proto/locks/v1"
)

func TestFeedCursor(t *testing.T) {
	t.Parallel()
	for _, p := range []feedPos{{}, {xid: 1, id: 2}, {xid: 1<<63 + 5, id: 1<<62 + 7}} {
		got, err := parseCursor("after", p.cursor())
		if err != nil || got != p {
			t.Fatalf("%+v: round trip gave %+v, %v", p, got, err)
		}
	}
	if p, err := parseCursor("after", ""); err != nil || p != (feedPos{}) {
		t.Fatalf("empty cursor: %+v, %v", p, err)
	}
	for _, bad := range []string{"x", "AAAA", feedPos{xid: 1}.cursor() + "A", strings.Repeat("A", 23)} {
		if _, err := parseCursor("after", bad); err == nil {
			t.Fatalf("cursor %q accepted", bad)
		}
	}
}

// feedPage is a REST feed page with each event's bytes as served.
type feedPage struct {
	Events []struct {
		Cursor string          `json:"cursor"`
		Event  json.RawMessage `json:"event"`
	} `json:"events"`
	NextCursor string `json:"next_cursor"`
}

// readFeedREST reads client's whole feed after cursor over REST in pages of size, with token.
func readFeedREST(e *env, token, client, after string, size int) (bodies [][]byte, next string) {
	e.t.Helper()
	next = after
	for {
		r := e.want(e.do("GET", fmt.Sprintf("/v1/clients/%s/events?page_size=%d&after=%s", client, size, next), nil,
			"Authorization", "Bearer "+token), 200)
		var p feedPage
		if err := json.Unmarshal(r.raw, &p); err != nil {
			e.t.Fatalf("feed page: %v: %s", err, r.raw)
		}
		if len(p.Events) > size {
			e.t.Fatalf("page of %d events, asked for %d", len(p.Events), size)
		}
		for i, it := range p.Events {
			bodies = append(bodies, it.Event)
			if i == len(p.Events)-1 && it.Cursor != p.NextCursor {
				e.t.Fatalf("next_cursor %q is not the last event's cursor %q", p.NextCursor, it.Cursor)
			}
		}
		if len(p.Events) == 0 {
			if p.NextCursor != next {
				e.t.Fatalf("an empty page moved the cursor from %q to %q", next, p.NextCursor)
			}
			return bodies, next
		}
		next = p.NextCursor
	}
}

// readFeedAtLeast reads client's feed after cursor until it has n events or within has
// passed. A read's horizon is conservative: a transaction of another database that ends while
// the read runs holds that one read back (api/feed.go), and other tests' transactions run all
// the time, so a test that expects events polls for them.
func readFeedAtLeast(e *env, token, client, after string, size, n int, within time.Duration) (bodies [][]byte, next string) {
	e.t.Helper()
	next = after
	deadline := time.Now().Add(within)
	for len(bodies) < n && time.Now().Before(deadline) {
		var more [][]byte
		more, next = readFeedREST(e, token, client, next, size)
		bodies = append(bodies, more...)
	}
	return bodies, next
}

// insertDelivery writes a delivery row as the notifier does, in q's transaction.
func insertDelivery(t testing.TB, q interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}, client string, ev event.Event, state string) {
	t.Helper()
	payload, err := json.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.Exec(t.Context(), `INSERT INTO notifier_deliveries (event_id, client_id, sensor_id, revision, payload, state)
		VALUES ($1, $2, $3, $4, $5, $6)`, ev.ID, client, ev.SensorID, ev.Revision, payload, state); err != nil {
		t.Fatal(err)
	}
}

func feedEvent(sensor string, rev int64) event.Event {
	d := uint8(rev % 2)
	e := event.Event{V: event.Version, ID: event.ID(sensor, rev), Type: event.TypeStateChanged,
		OccurredAt: time.Date(2026, 11, 26, 10, 0, 0, int(rev)*1e6, time.UTC), SensorID: sensor, Data: d, Revision: rev}
	if rev > 1 {
		p := 1 - d
		e.PreviousData = &p
	}
	return e
}

func webhookBody(t testing.TB, e event.Event, address string) []byte {
	b, err := event.WebhookBody(e, address)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestFeedOrderAndPaging: every delivery of the client, whatever its state, in intake
// order, page by page, none of another client's; the same on a second instance and over
// gRPC; a client token reads its own feed only.
func TestFeedOrderAndPaging(t *testing.T) {
	t.Parallel()
	f := newTokenFixture(t)
	states := []string{"delivered", "dead", "superseded", "pending", "cancelled"}
	var want [][]byte
	for rev := int64(1); rev <= 6; rev++ {
		// One transaction per revision, as the notifier takes a sensor's events in; two
		// sensors interleaved; s2 is b's, and a's rows of it are a's all the same.
		err := pgx.BeginFunc(t.Context(), f.db, func(tx pgx.Tx) error {
			for _, s := range []string{"s1", "s2"} {
				ev := feedEvent(s, rev)
				insertDelivery(t, tx, f.a, ev, states[int(rev)%len(states)])
				want = append(want, webhookBody(t, ev, "Street "+s))
				insertDelivery(t, tx, f.b, ev, "delivered")
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	check := func(name string, got [][]byte) {
		t.Helper()
		if len(got) != len(want) {
			t.Fatalf("%s: %d events, want %d", name, len(got), len(want))
		}
		for i := range want {
			if !bytes.Equal(got[i], want[i]) {
				t.Fatalf("%s: event %d is\n%s\nwant\n%s", name, i, got[i], want[i])
			}
		}
	}
	got, _ := readFeedAtLeast(f.env, f.tokA, f.a, "", 5, len(want), 10*time.Second)
	check("REST, pages of 5", got)
	all, _ := readFeedAtLeast(f.env, testToken, f.a, "", 1000, len(want), 10*time.Second)
	check("REST, administrator, one page", all)

	// Resumed half-way on another instance (a restart, or another API process).
	other := newEnv(t, sharedDB(f.db))
	half, _ := readFeedAtLeast(f.env, f.tokA, f.a, "", 5, 5, 10*time.Second)
	half = half[:5]
	r := f.want(f.do("GET", "/v1/clients/"+f.a+"/events?page_size=5", nil, "Authorization", "Bearer "+f.tokA), 200)
	cur := r.str("next_cursor")
	rest, _ := readFeedAtLeast(other, f.tokA, f.a, cur, 3, len(want)-5, 10*time.Second)
	check("resumed on another instance", append(half, rest...))

	// gRPC: the same bytes.
	ctx := metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer "+f.tokA)
	res, err := locksv1.NewClientEventServiceClient(f.raw).ListClientEvents(ctx, &locksv1.ListClientEventsRequest{ClientId: f.a, PageSize: 1000})
	if err != nil {
		t.Fatal(err)
	}
	var g [][]byte
	for _, it := range res.GetEvents() {
		g = append(g, it.GetEvent())
	}
	check("gRPC", g)

	f.want(f.do("GET", "/v1/clients/"+f.a+"/events?after=nonsense", nil), 400)
	f.want(f.do("GET", "/v1/clients/"+f.a+"/events?page_size=-1", nil), 400)
	f.want(f.do("GET", "/v1/clients/cl_aaaaaaaaaaaaaaaaaaaa/events", nil), 404)
	f.want(f.do("GET", "/v1/clients/"+f.b+"/events", nil, "Authorization", "Bearer "+f.tokA), 403)
}

// TestFeedLateCommit: a transaction that began first and commits last never lands behind a
// cursor handed out meanwhile.
func TestFeedLateCommit(t *testing.T) {
	f := newTokenFixture(t)
	ctx := t.Context()
	early, err := f.db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = early.Rollback(context.Background()) }()
	insertDelivery(t, early, f.a, feedEvent("s1", 1), "pending") // takes its transaction id now
	insertDelivery(t, f.db, f.a, feedEvent("s2", 1), "pending")  // a later transaction, committed first
	got, cur := readFeedREST(f.env, f.tokA, f.a, "", 10)
	if len(got) != 0 {
		t.Fatalf("the feed showed %s while an earlier transaction was open", got[0])
	}
	if err := early.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	want := [][]byte{webhookBody(t, feedEvent("s1", 1), "Street s1"), webhookBody(t, feedEvent("s2", 1), "Street s2")}
	more, _ := readFeedAtLeast(f.env, f.tokA, f.a, cur, 10, 2, 10*time.Second)
	got = append(got, more...)
	if len(got) != 2 || !bytes.Equal(got[0], want[0]) || !bytes.Equal(got[1], want[1]) {
		t.Fatalf("feed after the commit:\n%s\nwant\n%s", bytes.Join(got, []byte("\n")), bytes.Join(want, []byte("\n")))
	}
}
