package notifier

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// A newer revision ingested while an older one's first attempt is in flight flags the older
// row; if that attempt is then aborted (the notifier stopping, or a queued row given back),
// the row was never refused by the receiver: it goes back to pending and is sent first, not
// superseded (fault run: two webhooks lost, "superseded, attempts 0", after a NATS node kill
// made a notifier stop its partitions). A counted failure is still superseded.
func TestAbortedAttemptIsNotSuperseded(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.client("c1", "http://127.0.0.1:1/")
	for _, s := range []string{"s1", "s2"} {
		e.sensor(s, "here")
		e.subscribe("c1", s)
	}
	ctx := t.Context()
	ingest := func(revision int64) {
		t.Helper()
		evs := []struct{ sensor string }{{"s1"}, {"s2"}}
		for _, ev := range evs {
			e.exec(`INSERT INTO notifier_deliveries (event_id, client_id, sensor_id, revision, payload) VALUES ($1, 'c1', $2, $3, '{}')`,
				ev.sensor+"-"+string(rune('0'+revision)), ev.sensor, revision)
		}
	}
	ingest(1)
	cs, err := claim(ctx, e.pool, capacity{perClient: 10}, 10, 42, time.Minute)
	if err != nil || len(cs) != 2 {
		t.Fatalf("claim: %d rows, %v; want both revision 1 rows", len(cs), err)
	}
	ingest(2)
	if err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		_, err := supersede(ctx, tx, []string{"c1", "c1"}, []string{"s1", "s2"})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	var flagged int
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM notifier_deliveries WHERE revision = 1 AND supersede_on_finish`).Scan(&flagged); err != nil || flagged != 2 {
		t.Fatalf("%d in-flight rows flagged (%v), want 2", flagged, err)
	}
	var rs []result
	for _, c := range cs {
		if c.sensorID == "s1" {
			rs = append(rs, result{c: c, aborted: true, at: time.Now()})
		} else {
			rs = append(rs, result{c: c, state: StatePending, delay: time.Second, status: 503, at: time.Now()})
		}
	}
	if _, err := finish(context.WithoutCancel(ctx), e.pool, rs, 0, time.Now()); err != nil {
		t.Fatal(err)
	}
	state := func(sensor string) (st string, leased bool) {
		t.Helper()
		if err := e.pool.QueryRow(ctx, `SELECT state, lease_until IS NOT NULL FROM notifier_deliveries WHERE sensor_id = $1 AND revision = 1`, sensor).
			Scan(&st, &leased); err != nil {
			t.Fatal(err)
		}
		return st, leased
	}
	if st, leased := state("s1"); st != StatePending || leased {
		t.Errorf("revision 1 of s1 after an aborted attempt: %s (leased %v), want pending and released", st, leased)
	}
	if st, _ := state("s2"); st != "superseded" {
		t.Errorf("revision 1 of s2 after a failed attempt: %s, want superseded", st)
	}
	// The aborted row is the next of its key, before revision 2.
	next, err := claim(ctx, e.pool, capacity{perClient: 10}, 10, 43, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range next {
		if c.sensorID == "s1" && c.revision != 1 {
			t.Errorf("s1's next claim is revision %d, want 1", c.revision)
		}
	}
}
