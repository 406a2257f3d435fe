package api

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/lock-sensors/lock-sensors/internal/event"
	locksv1 "github.com/lock-sensors/lock-sensors/proto/locks/v1"
)

// watchItem is one item received from a watch, with when it came.
type watchItem struct {
	cursor string
	body   []byte
	at     time.Time
}

// watchGRPC opens a gRPC watch of client after cursor with token on e; items arrive on the
// channel until the watch ends (its error then on errc).
func watchGRPC(t *testing.T, e *env, token, client, after string) (items chan watchItem, errc chan error, stop func()) {
	ctx, cancel := context.WithCancel(metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer "+token))
	stream, err := locksv1.NewClientEventServiceClient(e.raw).WatchClientEvents(ctx, &locksv1.WatchClientEventsRequest{ClientId: client, After: after})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Header(); err != nil {
		t.Fatal(err)
	}
	items, errc = make(chan watchItem, 10000), make(chan error, 1)
	go func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				errc <- err
				return
			}
			items <- watchItem{m.GetCursor(), m.GetEvent(), time.Now()}
		}
	}()
	return items, errc, cancel
}

// next waits for n items.
func next(t *testing.T, items chan watchItem, n int, within time.Duration) []watchItem {
	t.Helper()
	var out []watchItem
	deadline := time.After(within)
	for len(out) < n {
		select {
		case it := <-items:
			out = append(out, it)
		case <-deadline:
			t.Fatalf("%d of %d items within %s", len(out), n, within)
		}
	}
	return out
}

func noMore(t *testing.T, items chan watchItem, wait time.Duration) {
	t.Helper()
	select {
	case it := <-items:
		t.Fatalf("unexpected item %s", it.body)
	case <-time.After(wait):
	}
}

// TestWatch: a watch gets what is there and then each new event within a second, in order;
// resumed from its last cursor on another instance it gets every later event once; REST
// serves the same items as newline-delimited JSON.
func TestWatch(t *testing.T) {
	f := newTokenFixture(t)
	other := newEnv(t, sharedDB(f.db))
	rev := int64(0)
	insert := func(n int) (bodies [][]byte, at time.Time) {
		for range n {
			rev++
			ev := feedEvent("s1", rev)
			insertDelivery(t, f.db, f.a, ev, "pending")
			insertDelivery(t, f.db, f.b, ev, "pending") // b's: never in a's watch
			bodies = append(bodies, webhookBody(t, ev, "Street s1"))
		}
		return bodies, time.Now()
	}
	check := func(got []watchItem, want [][]byte, since time.Time) {
		t.Helper()
		for i := range want {
			if !bytes.Equal(got[i].body, want[i]) {
				t.Fatalf("item %d is\n%s\nwant\n%s", i, got[i].body, want[i])
			}
			if !since.IsZero() && got[i].at.Sub(since) > time.Second {
				t.Fatalf("item %d came %s after its commit", i, got[i].at.Sub(since))
			}
		}
	}

	before, _ := insert(3)
	items, errc, stop := watchGRPC(t, f.env, f.tokA, f.a, "")
	check(next(t, items, 3, 30*time.Second), before, time.Time{})
	var last string
	for range 3 { // live, one at a time
		want, at := insert(1)
		got := next(t, items, 1, 30*time.Second)
		check(got, want, at)
		last = got[0].cursor
	}
	noMore(t, items, 300*time.Millisecond)
	stop()
	<-errc

	// Events while disconnected; resumed on another instance.
	missed, _ := insert(4)
	items, errc, stop = watchGRPC(t, other, f.tokA, f.a, last)
	check(next(t, items, 4, 30*time.Second), missed, time.Time{})
	want, at := insert(2)
	check(next(t, items, 2, 30*time.Second), want, at)
	noMore(t, items, 300*time.Millisecond)
	stop()
	<-errc

	// Another client's token: refused, whether or not the client exists.
	_, errc, stop = watchGRPC(t, f.env, f.tokB, f.a, "")
	if err := <-errc; status.Code(err) != codes.PermissionDenied {
		t.Fatalf("b's token watching a: %v", err)
	}
	stop()

	// REST: NDJSON lines of {"cursor", "event"}, from the start.
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "GET", f.url+"/v1/clients/"+f.a+"/events:watch", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+f.tokA)
	res, err := f.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != 200 || res.Header.Get("Content-Type") != "application/x-ndjson" {
		t.Fatalf("REST watch: %d %s", res.StatusCode, res.Header.Get("Content-Type"))
	}
	lines := bufio.NewScanner(res.Body)
	read := func(n int) []watchItem {
		var out []watchItem
		for len(out) < n && lines.Scan() {
			var line struct {
				Cursor string          `json:"cursor"`
				Event  json.RawMessage `json:"event"`
			}
			if err := json.Unmarshal(lines.Bytes(), &line); err != nil || line.Cursor == "" {
				t.Fatalf("REST watch line %s: %v", lines.Bytes(), err)
			}
			out = append(out, watchItem{line.Cursor, line.Event, time.Now()})
		}
		if len(out) < n {
			t.Fatalf("REST watch ended after %d lines: %v", len(out), lines.Err())
		}
		return out
	}
	feed, _ := readFeedAtLeast(f.env, f.tokA, f.a, "", 1000, 12, 10*time.Second)
	if len(feed) != 12 {
		t.Fatalf("the feed has %d events, want 12", len(feed))
	}
	got := read(len(feed))
	for i := range feed {
		if !bytes.Equal(got[i].body, feed[i]) {
			t.Fatalf("REST watch item %d is\n%s\nthe feed's\n%s", i, got[i].body, feed[i])
		}
	}
	w, at := insert(1)
	check(read(1), w, at)
}

// TestWatchSlowWatcherIsCutOff: a watcher that does not read is cut off with
// RESOURCE_EXHAUSTED once a batch cannot leave in time, and resumes from its last cursor
// with every later event once.
func TestWatchSlowWatcherIsCutOff(t *testing.T) {
	t.Parallel()
	f := newTokenFixture(t, func(c *Config, _ *Deps) { c.WatchSendTimeout = 300 * time.Millisecond })
	const n = 3000 // ~1 MB of bodies: more than the flow-control window below
	var ids, sensors []string
	var revs []int64
	var payloads [][]byte
	var want [][]byte
	for rev := int64(1); rev <= n; rev++ {
		ev := feedEvent("s1", rev)
		ev.Type = event.TypeConnectionRestored
		p, err := json.Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		ids, sensors, revs, payloads = append(ids, ev.ID), append(sensors, "s1"), append(revs, rev), append(payloads, p)
		want = append(want, webhookBody(t, ev, "Street s1"))
	}
	if _, err := f.db.Exec(t.Context(), `INSERT INTO notifier_deliveries (event_id, client_id, sensor_id, revision, payload, state)
		SELECT e, $1, s, r, p, 'delivered' FROM unnest($2::text[], $3::text[], $4::bigint[], $5::bytea[]) AS u(e, s, r, p)`,
		f.a, ids, sensors, revs, payloads); err != nil {
		t.Fatal(err)
	}
	// A client with a small, fixed window (no BDP growth), which reads nothing at first.
	conn, err := grpc.NewClient(f.raw.Target(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+f.tokA)
	stream, err := locksv1.NewClientEventServiceClient(conn).WatchClientEvents(ctx, &locksv1.WatchClientEventsRequest{ClientId: f.a})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second) // the slow reader: not reading is what is tested
	var got [][]byte
	var last string
	for {
		m, err := stream.Recv()
		if err != nil {
			if status.Code(err) != codes.ResourceExhausted {
				t.Fatalf("a watcher that did not read ended with %v, want RESOURCE_EXHAUSTED", err)
			}
			break
		}
		got, last = append(got, m.GetEvent()), m.GetCursor()
	}
	if len(got) >= n {
		t.Fatalf("the slow watcher got all %d events: it was not cut off for being slow", len(got))
	}
	items, errc, stop := watchGRPC(t, f.env, f.tokA, f.a, last)
	defer func() { stop(); <-errc }()
	for _, it := range next(t, items, n-len(got), 30*time.Second) {
		got = append(got, it.body)
	}
	noMore(t, items, 300*time.Millisecond)
	for i := range want {
		if !bytes.Equal(got[i], want[i]) {
			t.Fatalf("event %d is\n%s\nwant\n%s", i, got[i], want[i])
		}
	}
}
