package api

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

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
	check(next(t, items, 3, 5*time.Second), before, time.Time{})
	var last string
	for range 3 { // live, one at a time
		want, at := insert(1)
		got := next(t, items, 1, 5*time.Second)
		check(got, want, at)
		last = got[0].cursor
	}
	noMore(t, items, 300*time.Millisecond)
	stop()
	<-errc

	// Events while disconnected; resumed on another instance.
	missed, _ := insert(4)
	items, errc, stop = watchGRPC(t, other, f.tokA, f.a, last)
	check(next(t, items, 4, 5*time.Second), missed, time.Time{})
	want, at := insert(2)
	check(next(t, items, 2, 5*time.Second), want, at)
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
	feed, _ := readFeedREST(f.env, f.tokA, f.a, "", 1000)
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
