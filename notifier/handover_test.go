package notifier

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lock-sensors/lock-sensors/internal/partition"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// A notifier stopped while its intake transaction waits with the COMMIT already sent: the
// server commits it when the wait ends, leases and all. The next owner must attempt the
// delivery at once, not after the lease (here over ten seconds) of a process that is gone.
func TestStopMidCommitLeavesNoRowLeased(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 200*time.Millisecond)
	e.cfg.WebhookTimeout = 10 * time.Second // the lease is longer still
	rc := newReceiver(t, nil)
	e.subscribed(rc.URL)
	e.start()
	e.publish(testEvent("s1", 1, 1))
	testenv.Eventually(t, 10*time.Second, "revision 1 delivered", func() bool { return rc.count() == 1 })

	// The next intake's last round trip (its lease, its position, its COMMIT) waits for the
	// position row, held here.
	ctx := t.Context()
	hold, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = hold.Rollback(context.Background()) }()
	p := partition.Of("s1", testPartitions)
	if _, err := hold.Exec(ctx, `SELECT 1 FROM notifier_positions WHERE partition = $1 FOR UPDATE`, p); err != nil {
		t.Fatal(err)
	}
	e.publish(testEvent("s1", 2, 0))
	stopWhileWaiting(t, e, hold, "the intake", "notifier_positions")

	e.start()
	from := time.Now()
	testenv.Eventually(t, 5*time.Second, "revision 2 delivered by the next owner", func() bool { return rc.count() >= 2 })
	var b gotBody
	if err := json.Unmarshal(rc.got()[1].body, &b); err != nil || b.Revision != 2 {
		t.Fatalf("second webhook: revision %d (%v), want 2", b.Revision, err)
	}
	t.Logf("revision 2 delivered %s after the next owner started", time.Since(from).Round(time.Millisecond))
}

// The same for a claim: a notifier stopped while its claim's lease waits, COMMIT sent, for a
// row another transaction holds. The next owner retries the delivery when it is due, not
// after the lease of a process that is gone.
func TestStopMidClaimLeavesNoRowLeased(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Second)
	e.cfg.WebhookTimeout = 10 * time.Second
	rc := newReceiver(t, func(n int, _ http.ResponseWriter, _ *http.Request) int {
		if n == 1 {
			return http.StatusInternalServerError // retried after the schedule's second
		}
		return http.StatusOK
	})
	e.subscribed(rc.URL)
	e.start()
	e.publish(testEvent("s1", 1, 1))
	ctx := t.Context()
	var id int64
	testenv.Eventually(t, 10*time.Second, "the first attempt failed and recorded", func() bool {
		err := e.pool.QueryRow(ctx, `SELECT id FROM notifier_deliveries
			WHERE state = 'pending' AND attempts = 1 AND lease_until IS NULL`).Scan(&id)
		return err == nil
	})

	// The retry's claim finds the row due and waits for it in its lease, the COMMIT sent.
	hold, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = hold.Rollback(context.Background()) }()
	if _, err := hold.Exec(ctx, `SELECT 1 FROM notifier_deliveries WHERE id = $1 FOR UPDATE`, id); err != nil {
		t.Fatal(err)
	}
	stopWhileWaiting(t, e, hold, "the claim", "lease_until")
	if rc.count() != 1 {
		t.Fatalf("%d attempts before the next owner started, want 1", rc.count())
	}

	e.start()
	from := time.Now()
	testenv.Eventually(t, 5*time.Second, "the retry made by the next owner", func() bool { return rc.count() >= 2 })
	t.Logf("retried %s after the next owner started", time.Since(from).Round(time.Millisecond))
}

// stopWhileWaiting waits until a statement of e's notifier (named what, its text containing
// stmt) waits for a lock that hold has, stops the notifier, and ends hold. A stop that
// returns before hold ends has left the transaction to the server; one that does not is
// waiting for its outcome, which it gets once hold ends.
func stopWhileWaiting(t *testing.T, e *env, hold pgx.Tx, what, stmt string) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, what+" waiting for a lock", func() bool {
		var n int
		err := e.pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%' || $1 || '%'`, stmt).Scan(&n)
		return err == nil && n > 0
	})
	stopped := make(chan struct{})
	go func() { e.stop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(time.Second):
	}
	if err := hold.Rollback(t.Context()); err != nil {
		t.Fatal(err)
	}
	<-stopped
}
