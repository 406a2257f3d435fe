package api

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc/metadata"

	"github.com/lock-sensors/lock-sensors/internal/testenv"
	locksv1 "github.com/lock-sensors/lock-sensors/proto/locks/v1"
)

// TestFeedHorizonSkipsOtherDatabases: a write transaction open in another database of the
// server, which holds the server's xmin back, does not hold this database's feed and watch;
// one open in this database does (TestFeedLateCommit).
func TestFeedHorizonSkipsOtherDatabases(t *testing.T) {
	f := newTokenFixture(t)
	ctx := t.Context()
	_, otherDB := testenv.Postgres(t)
	tx, err := otherDB.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	var otherXid string
	if err := tx.QueryRow(ctx, `SELECT pg_current_xact_id()::text`).Scan(&otherXid); err != nil {
		t.Fatal(err)
	}
	items, errc, stop := watchGRPC(t, f.env, f.tokA, f.a, "")
	defer func() { stop(); <-errc }()

	insertDelivery(t, f.db, f.a, feedEvent("s1", 1), "pending")
	at := time.Now()
	var held bool // the server's own horizon is held by the other database's transaction
	if err := f.db.QueryRow(ctx, `SELECT pg_snapshot_xmin(pg_current_snapshot()) <= $1::text::xid8`, otherXid).Scan(&held); err != nil {
		t.Fatal(err)
	}
	if !held {
		t.Fatal("the other database's open transaction does not hold the server's xmin: the test shows nothing")
	}
	want := webhookBody(t, feedEvent("s1", 1), "Street s1")
	got := next(t, items, 1, 5*time.Second)
	if !bytes.Equal(got[0].body, want) {
		t.Fatalf("watch item %s, want %s", got[0].body, want)
	}
	if d := got[0].at.Sub(at); d > time.Second {
		t.Fatalf("the watch item came %s after its commit, held by another database's transaction", d)
	}
	if page, _ := readFeedAtLeast(f.env, f.tokA, f.a, "", 10, 1, time.Second); len(page) != 1 || !bytes.Equal(page[0], want) {
		t.Fatalf("the feed is %q while another database's transaction is open, want the event", page)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestWatchBooks: delivery rows committed by concurrent transactions of varied length, some
// beginning before others that commit first, while watchers come and go (resuming from their
// last cursor) and the hub sends slow ones back to the database; every watcher's items, put
// end to end, are the feed exactly: every event once, in order, with the feed's cursors.
func TestWatchBooks(t *testing.T) {
	t.Parallel()
	f := newTokenFixture(t)
	f.srv.hub.mu.Lock()
	f.srv.hub.queue = 3 // watchers fall behind the hub often
	f.srv.hub.mu.Unlock()
	ctx := t.Context()
	const writers, perWriter, watchers = 4, 60, 6
	const total = writers * perWriter
	deadline := time.Now().Add(60 * time.Second)

	type item struct {
		cursor string
		body   []byte
	}
	// Each watcher watches for a while, hangs up and resumes from its last cursor, until it
	// has as many items as were written (or the deadline); the first two keep one watch open
	// throughout, the hub's way.
	got := make([][]item, watchers)
	var w errgroup.Group
	for i := range watchers {
		w.Go(func() error {
			rng := rand.New(rand.NewPCG(uint64(i), 1))
			cursor := ""
			for len(got[i]) < total && time.Now().Before(deadline) {
				lasts := time.Duration(100+rng.IntN(700)) * time.Millisecond
				if i < 2 {
					lasts = time.Until(deadline)
				}
				wctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+f.tokA), lasts)
				stream, err := locksv1.NewClientEventServiceClient(f.raw).WatchClientEvents(wctx,
					&locksv1.WatchClientEventsRequest{ClientId: f.a, After: cursor})
				if err != nil {
					cancel()
					return err
				}
				slow := i >= 2 && rng.IntN(3) == 0 // reads slowly: falls behind the hub
				for len(got[i]) < total {
					m, err := stream.Recv()
					if err != nil {
						break // the watch's time is up
					}
					got[i] = append(got[i], item{m.GetCursor(), m.GetEvent()})
					cursor = m.GetCursor()
					if slow {
						time.Sleep(time.Duration(rng.IntN(5)) * time.Millisecond)
					}
				}
				cancel()
			}
			return nil
		})
	}

	// The writers: one transaction per event, its id taken before a pause, so that later
	// transactions often commit before earlier ones; now and then a longer pause.
	var g errgroup.Group
	for wr := range writers {
		sensor := "s" + strconv.Itoa(wr%3+1)
		g.Go(func() error {
			rng := rand.New(rand.NewPCG(uint64(wr), 2))
			for n := range perWriter {
				tx, err := f.db.Begin(ctx)
				if err != nil {
					return err
				}
				if _, err := tx.Exec(ctx, `SELECT pg_current_xact_id()`); err != nil {
					return err
				}
				pause := rng.IntN(20)
				if rng.IntN(15) == 0 {
					pause = 150
				}
				time.Sleep(time.Duration(pause) * time.Millisecond)
				ev := feedEvent(sensor, int64(wr*1000+n+1))
				ev.ID = fmt.Sprintf("evt_w%d_%d", wr, n)
				payload, err := json.Marshal(ev)
				if err != nil {
					return err
				}
				if _, err := tx.Exec(ctx, `INSERT INTO notifier_deliveries (event_id, client_id, sensor_id, revision, payload, state)
					VALUES ($1, $2, $3, $4, $5, 'pending')`, ev.ID, f.a, sensor, ev.Revision, payload); err != nil {
					return err
				}
				if err := tx.Commit(ctx); err != nil {
					return err
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	if err := w.Wait(); err != nil {
		t.Fatal(err)
	}

	// The whole feed, read by pages.
	var feed []item
	cursor := ""
	for {
		r, err := locksv1.NewClientEventServiceClient(f.conn).ListClientEvents(ctx, &locksv1.ListClientEventsRequest{ClientId: f.a, After: cursor, PageSize: 1000})
		if err != nil {
			t.Fatal(err)
		}
		if len(r.GetEvents()) == 0 {
			break
		}
		for _, e := range r.GetEvents() {
			feed = append(feed, item{e.GetCursor(), e.GetEvent()})
		}
		cursor = r.GetNextCursor()
	}
	if len(feed) != total {
		t.Fatalf("the feed has %d events, %d were written", len(feed), total)
	}
	for i := range watchers {
		if len(got[i]) != len(feed) {
			t.Errorf("watcher %d got %d items, the feed has %d", i, len(got[i]), len(feed))
		}
		for k, it := range got[i][:min(len(got[i]), len(feed))] {
			if it.cursor != feed[k].cursor || !bytes.Equal(it.body, feed[k].body) {
				t.Fatalf("watcher %d item %d is %s %s, the feed's %s %s", i, k, it.cursor, it.body, feed[k].cursor, feed[k].body)
			}
		}
	}
	f.srv.hub.mu.Lock()
	resyncs, handed := f.srv.hub.resyncs, f.srv.hub.handed
	f.srv.hub.mu.Unlock()
	t.Logf("%d watchers, %d events each; the hub handed out %d items and sent watchers back to the database %d times", watchers, total, handed, resyncs)
	if resyncs == 0 || handed == 0 {
		t.Fatal("the hub handed out no item, or no watcher fell behind it: both ways were not tested")
	}
}
