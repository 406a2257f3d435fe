package notifier

import (
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// allFacts is every combination of rowFacts.
func allFacts() []rowFacts {
	var out []rowFacts
	for i := range 16 {
		out = append(out, rowFacts{attempted: i&1 != 0, inFlight: i&2 != 0, flagged: i&4 != 0, newer: i&8 != 0})
	}
	return out
}

// TestEnqueueState: a row entering the queue after a newer revision is superseded at once.
func TestEnqueueState(t *testing.T) {
	t.Parallel()
	if got := enqueueState(false); got != StatePending {
		t.Errorf("enqueueState(no newer) = %s, want pending", got)
	}
	if got := enqueueState(true); got != StateSuperseded {
		t.Errorf("enqueueState(newer) = %s, want superseded", got)
	}
}

// TestSweep is the supersede decision for a pending row when newer revisions come.
func TestSweep(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		f    rowFacts
		want sweepVerdict
	}{
		{"no newer revision", rowFacts{attempted: true}, sweepKeep},
		{"never attempted, waiting its turn: sent in revision order", rowFacts{newer: true}, sweepKeep},
		{"failed, waiting for a retry", rowFacts{attempted: true, newer: true}, sweepSupersede},
		{"first attempt in flight", rowFacts{inFlight: true, newer: true}, sweepFlag},
		{"retry in flight", rowFacts{attempted: true, inFlight: true, newer: true}, sweepFlag},
		{"in flight and flagged before", rowFacts{attempted: true, inFlight: true, flagged: true, newer: true}, sweepKeep},
		{"flagged, its lease expired after a failure", rowFacts{attempted: true, flagged: true, newer: true}, sweepSupersede},
		{"flagged, its first attempt aborted", rowFacts{flagged: true, newer: true}, sweepKeep},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := sweep(tc.f); got != tc.want {
				t.Fatalf("sweep(%+v) = %d, want %d", tc.f, got, tc.want)
			}
		})
	}
}

// TestFinishState is the supersede decision when an attempt of a leased row ends.
func TestFinishState(t *testing.T) {
	t.Parallel()
	flagged := rowFacts{inFlight: true, flagged: true, newer: true}
	flaggedRetry := rowFacts{attempted: true, inFlight: true, flagged: true, newer: true}
	for _, tc := range []struct {
		name    string
		f       rowFacts
		counted bool
		outcome string
		want    string
	}{
		{"delivered", rowFacts{inFlight: true}, true, StateDelivered, StateDelivered},
		{"failed, no newer revision: retried", rowFacts{inFlight: true}, true, StatePending, StatePending},
		{"failed, a newer revision came: superseded", rowFacts{inFlight: true, newer: true}, true, StatePending, StateSuperseded},
		{"failed while flagged", flagged, true, StatePending, StateSuperseded},
		{"delivered while flagged: delivered", flagged, true, StateDelivered, StateDelivered},
		{"dead while flagged: dead", flagged, true, StateDead, StateDead},
		{"dead with a newer revision: dead", rowFacts{attempted: true, inFlight: true, newer: true}, true, StateDead, StateDead},
		{"cancelled with a newer revision", rowFacts{inFlight: true, newer: true}, true, StateCancelled, StateCancelled},
		{"first attempt aborted while flagged: sent first", flagged, false, "", StatePending},
		{"retry aborted while flagged: superseded", flaggedRetry, false, "", StateSuperseded},
		{"retry aborted, not flagged", rowFacts{attempted: true, inFlight: true, newer: true}, false, "", StatePending},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := finishState(tc.f, tc.counted, tc.outcome); got != tc.want {
				t.Fatalf("finishState = %s, want %s", got, tc.want)
			}
		})
	}
}

// finishOutcomes are the (counted, outcome) pairs of an attempt's end.
var finishOutcomes = []struct {
	counted bool
	outcome string
}{{true, StatePending}, {true, StateDelivered}, {true, StateDead}, {true, StateCancelled}, {false, StatePending}}

// TestFinishPlan: the plan finish's UPDATE completes (finishStateSQL, mirrored by
// finishPlan.state) gives finishState's answer for every row.
func TestFinishPlan(t *testing.T) {
	t.Parallel()
	for _, o := range finishOutcomes {
		for _, f := range allFacts() {
			f.inFlight = true
			p := planFinish(f.attempted, o.counted, o.outcome)
			if got, want := p.state(f.flagged, f.newer), finishState(f, o.counted, o.outcome); got != want {
				t.Errorf("%+v, counted %v, %s: plan %+v gives %s, finishState %s", f, o.counted, o.outcome, p, got, want)
			}
		}
	}
}

// sweepRow inserts, for sensor, a pending row of revision 1 with the facts f (a lease of
// token 7 when in flight), and a row of revision 2 when f.newer; it returns the first's id.
func sweepRow(t *testing.T, db DB, sensor string, f rowFacts) int64 {
	t.Helper()
	attempts, lease := 0, "NULL"
	if f.attempted {
		attempts = 1
	}
	if f.inFlight {
		lease = "now() + interval '1 minute'"
	} else if f.flagged {
		lease = "now() - interval '1 minute'" // a flag left by an attempt whose lease expired
	}
	var id int64
	if err := db.QueryRow(t.Context(), `INSERT INTO notifier_deliveries
		(event_id, client_id, sensor_id, revision, payload, attempts, lease_until, lease_token, supersede_on_finish)
		VALUES ($1 || '-1', 'c1', $1, 1, '{}', $2, `+lease+`, 7, $3) RETURNING id`, sensor, attempts, f.flagged).Scan(&id); err != nil {
		t.Fatal(err)
	}
	if f.newer {
		if _, err := db.Exec(t.Context(), `INSERT INTO notifier_deliveries (event_id, client_id, sensor_id, revision, payload)
			VALUES ($1 || '-2', 'c1', $1, 2, '{}')`, sensor); err != nil {
			t.Fatal(err)
		}
	}
	return id
}

// TestSupersedeSweepWiring: supersede, on Postgres, leaves every combination of a row's
// facts as sweep decides: its candidate filter passes each row sweep acts on, and its
// UPDATE writes the verdicts. Half the rows are swept by key (ingest), the rest by the
// janitor's sweep of every key.
func TestSupersedeSweepWiring(t *testing.T) {
	t.Parallel()
	_, pool := testenv.Postgres(t)
	ctx := t.Context()
	ids := map[string]int64{}
	facts := map[string]rowFacts{}
	var keyClients, keySensors []string
	for i, f := range allFacts() {
		sensor := fmt.Sprintf("s%02d", i)
		ids[sensor], facts[sensor] = sweepRow(t, pool, sensor, f), f
		if i%2 == 0 {
			keyClients, keySensors = append(keyClients, "c1"), append(keySensors, sensor)
		}
	}
	superseded := 0
	for _, keys := range [][2][]string{{keyClients, keySensors}, {nil, nil}} {
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			recs, err := supersede(ctx, tx, keys[0], keys[1])
			superseded += len(recs)
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	want := 0
	for sensor, f := range facts {
		state, flagged := StatePending, f.flagged
		switch sweep(f) {
		case sweepSupersede:
			state, flagged = StateSuperseded, true
			want++
		case sweepFlag:
			flagged = true
		}
		var gotState string
		var gotFlagged bool
		if err := pool.QueryRow(ctx, `SELECT state, supersede_on_finish FROM notifier_deliveries WHERE id = $1 AND sensor_id = $2`,
			ids[sensor], sensor).Scan(&gotState, &gotFlagged); err != nil {
			t.Fatal(err)
		}
		if gotState != state || gotFlagged != flagged {
			t.Errorf("%+v: %s, flagged %v; sweep says %s, flagged %v", f, gotState, gotFlagged, state, flagged)
		}
	}
	if superseded != want {
		t.Errorf("%d superseded records, want %d", superseded, want)
	}
}

// TestFinishSupersedeWiring: finish, on Postgres, leaves every leased row in the state
// finishState gives for its facts and its attempt's end, through the plan its UPDATE completes.
func TestFinishSupersedeWiring(t *testing.T) {
	t.Parallel()
	_, pool := testenv.Postgres(t)
	type row struct {
		f       rowFacts
		counted bool
		outcome string
	}
	rows := map[string]row{}
	var rs []result
	for i, o := range finishOutcomes {
		for j, f := range allFacts() {
			if !f.inFlight {
				continue // finish writes only rows it holds the lease of
			}
			sensor := fmt.Sprintf("s%d-%02d", i, j)
			attempts := 0
			if f.attempted {
				attempts = 1
			}
			c := claimed{id: sweepRow(t, pool, sensor, f), token: 7, clientID: "c1", sensorID: sensor, eventID: sensor + "-1", attempts: attempts}
			rs = append(rs, result{c: c, aborted: !o.counted, state: o.outcome, delay: time.Minute, status: 500, at: time.Now()})
			rows[sensor] = row{f, o.counted, o.outcome}
		}
	}
	if _, err := finish(t.Context(), pool, rs, 0, time.Now()); err != nil {
		t.Fatal(err)
	}
	for sensor, r := range rows {
		var got string
		if err := pool.QueryRow(t.Context(), `SELECT state FROM notifier_deliveries WHERE sensor_id = $1 AND revision = 1`, sensor).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if want := finishState(r.f, r.counted, r.outcome); got != want {
			t.Errorf("%+v, counted %v, %s: %s, finishState says %s", r.f, r.counted, r.outcome, got, want)
		}
	}
}
