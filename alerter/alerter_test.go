package alerter

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/partition"
	"github.com/lock-sensors/lock-sensors/internal/procs"
	"github.com/lock-sensors/lock-sensors/internal/rebuild"
	"github.com/lock-sensors/lock-sensors/internal/setaside"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
	rebuildrunner "github.com/lock-sensors/lock-sensors/projector/rebuild"
	"github.com/lock-sensors/lock-sensors/projector/state"
)

// kindCase makes one alert kind's condition hold (fire) and then stop holding (clear).
type kindCase struct {
	kind, subject string
	fire, clear   func(e *env)
}

func (e *env) putProcess(id string, updated time.Time) {
	e.t.Helper()
	ctx := e.t.Context()
	kv, err := e.nats.JS.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: natsx.ProcessesBucket, History: 1})
	if err != nil {
		e.t.Fatal(err)
	}
	v, _ := json.Marshal(procs.Info{ID: id, Host: "h1", PID: 42, Parts: []string{"state", "notifier"}, Version: "test",
		StartedAt: updated.Add(-time.Hour), UpdatedAt: updated, HTTPAddr: "127.0.0.1:8080"})
	if _, err := kv.Put(ctx, id, v); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) setAsideRecord(consumer string, seq uint64) {
	e.t.Helper()
	rec, _ := json.Marshal(setaside.Record{Consumer: consumer, Stream: natsx.ReadingsStream, StreamSeq: seq, Subject: "readings.0.x",
		Reason: "data", Detail: "data is 7", Time: time.Now().UTC(), Size: 3, Payload: []byte("bad")})
	if _, err := e.nats.JS.Publish(e.t.Context(), natsx.SetAsideSubject(consumer), rec); err != nil {
		e.t.Fatal(err)
	}
}

// readingsID is READINGS' identity as checkpoints name it.
func (e *env) readingsID() string {
	e.t.Helper()
	st, err := e.nats.JS.Stream(e.t.Context(), natsx.ReadingsStream)
	if err != nil {
		e.t.Fatal(err)
	}
	return st.CachedInfo().Created.UTC().Format(time.RFC3339Nano)
}

// sensorIn is a sensor id of partition p (of 4).
func sensorIn(p int) string {
	for i := 0; ; i++ {
		if id := fmt.Sprintf("s%d", i); partition.Of(id, 4) == p {
			return id
		}
	}
}

func kindCases() []kindCase {
	return []kindCase{
		{KindDeadLetter, "client/c1",
			func(e *env) {
				e.exec(`INSERT INTO clients (id, name, webhook_url, signing_secret) VALUES ('c1', 'c1', 'http://x', $1)`, testSecret)
				e.exec(`INSERT INTO notifier_deliveries (event_id, client_id, sensor_id, revision, payload, state) VALUES ('evt_1', 'c1', 's1', 1, '\x7b7d', 'dead')`)
			},
			func(e *env) { e.exec(`UPDATE notifier_deliveries SET state = 'pending' WHERE client_id = 'c1'`) }},
		{KindEndpointDisabled, "client/c2",
			func(e *env) {
				e.exec(`INSERT INTO clients (id, name, webhook_url, signing_secret, disabled_at, disabled_reason)
					VALUES ('c2', 'c2', 'http://x', $1, now(), 'failed for 1h')`, testSecret)
			},
			func(e *env) { e.exec(`UPDATE clients SET disabled_at = NULL, disabled_reason = NULL WHERE id = 'c2'`) }},
		{KindProjectionLag, "state/0",
			func(e *env) {
				if _, err := e.nats.JS.Publish(e.t.Context(), natsx.ReadingsSubject(sensorIn(0)), []byte(`{}`)); err != nil {
					e.t.Fatal(err)
				}
			},
			func(e *env) {
				e.exec(`INSERT INTO checkpoints (projection, partition, seq, stream) VALUES ('state', 0, 1, $1)`, e.readingsID())
			}},
		{KindSetAside, "consumer/history",
			func(e *env) { e.setAsideRecord("history", 7) },
			nil}, // resolves by itself after the quiet time
		{KindCheckpointMismatch, "state/1",
			func(e *env) {
				e.exec(`INSERT INTO checkpoints (projection, partition, seq, stream) VALUES ('state', 1, 5, '2020-01-01T00:00:00Z')`)
			},
			func(e *env) { // what a rebase does: the checkpoint restarts at the current stream
				e.exec(`UPDATE checkpoints SET seq = 0, stream = $1 WHERE projection = 'state' AND partition = 1`, e.readingsID())
			}},
		{KindReconciliationDrift, "partition/2",
			func(e *env) {
				e.exec(`INSERT INTO watchdog_sweeps (partition, swept_at, repairs) VALUES (2, now(), 3)`)
			},
			func(e *env) { e.exec(`UPDATE watchdog_sweeps SET swept_at = now(), repairs = 0 WHERE partition = 2`) }},
		{KindMassLoss, "sensors",
			func(e *env) {
				// 12 of 20 sensors went silent within 30 s of each other and are lost.
				for i := range 20 {
					conn, seen := "online", time.Now().Add(-2*time.Hour+time.Duration(i)*time.Minute)
					if i < 12 {
						conn, seen = "lost", time.Now().Add(-time.Hour-time.Duration(i)*2*time.Second)
					}
					e.exec(`INSERT INTO sensor_state (sensor_id, partition, data, last_seen, last_reading_time, changed_at, revision, connection, last_seq)
						VALUES ($1, 3, 1, $2, $2, $2, 1, $3, 1)`, fmt.Sprintf("m%02d", i), seen, conn)
				}
			},
			func(e *env) { e.exec(`UPDATE sensor_state SET connection = 'online' WHERE sensor_id < 'm06'`) }},
		{KindPartStopped, "process/h1-42-0badcafe",
			func(e *env) { e.putProcess("h1-42-0badcafe", time.Now().Add(-time.Minute)) },
			func(e *env) { e.putProcess("h1-42-0badcafe", time.Now().Add(time.Hour)) }}, // reports again
	}
}

// TestEachKindFiresAndResolvesOnce makes the condition of every kind hold, then stop, and
// checks that each fires once and resolves once, and that the SMTP server and the operator
// webhook (signatures verified) each receive every notice exactly once.
func TestEachKindFiresAndResolvesOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rb, err := rebuildrunner.New(rebuildrunner.Config{PartitionCount: 4}, rebuildrunner.Deps{JS: e.nats.JS, Logger: testenv.Logger(t),
		Projections: []rebuild.Projection{state.NewProjection(state.RebuildConfig{PartitionCount: 4},
			state.RebuildDeps{JS: e.nats.JS, PG: e.pg, Logger: testenv.Logger(t)})}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rb.Close)
	cfg := e.config()
	cfg.Lag, cfg.SetAsideQuiet = time.Millisecond, 2*time.Second
	cfg.MassLossMin = 10
	a, reg := e.alerter(cfg, Deps{Projections: rb})
	testenv.RunPart(t, "alerter", a.Run, 15*time.Second)

	cases := kindCases()
	for _, c := range cases {
		c.fire(e)
	}
	both := func(event string, want int) func() bool {
		return func() bool {
			mails, hooks := e.smtp.got(), e.hook.got()
			for _, c := range cases {
				if count(mails, c.kind, c.subject, event) < want || count(hooks, c.kind, c.subject, event) < want {
					return false
				}
			}
			return true
		}
	}
	testenv.Eventually(t, 30*time.Second, "a firing notice of every kind by e-mail and webhook", both(eventFiring, 1))
	// A second set-aside record while its alert fires is no new alert.
	e.setAsideRecord("history", 8)
	for _, c := range cases {
		if c.clear != nil {
			c.clear(e)
		}
	}
	testenv.Eventually(t, 30*time.Second, "a resolved notice of every kind by e-mail and webhook", both(eventResolved, 1))
	// Evaluations go on: nothing fires or resolves again.
	e.moreEvaluations(reg, 5)
	mails, hooks := e.smtp.got(), e.hook.got()
	for _, c := range cases {
		for _, ev := range []string{eventFiring, eventResolved} {
			if n := count(mails, c.kind, c.subject, ev); n != 1 {
				t.Errorf("%s %s %s: %d e-mails, want 1", c.kind, c.subject, ev, n)
			}
			if n := count(hooks, c.kind, c.subject, ev); n != 1 {
				t.Errorf("%s %s %s: %d webhooks, want 1", c.kind, c.subject, ev, n)
			}
		}
		var rows, open int
		if err := e.pg.QueryRow(t.Context(), `SELECT count(*), count(*) FILTER (WHERE resolved_at IS NULL) FROM alerts WHERE kind = $1`,
			c.kind).Scan(&rows, &open); err != nil || rows != 1 || open != 0 {
			t.Errorf("%s: %d alert rows, %d unresolved (%v); want 1 resolved", c.kind, rows, open, err)
		}
	}
	if len(mails) != 2*len(cases) || len(hooks) != 2*len(cases) {
		t.Errorf("%d e-mails and %d webhooks, want %d each", len(mails), len(hooks), 2*len(cases))
	}
	for _, r := range append(mails, hooks...) {
		if r.runbook != RunbookURL(r.kind) || !strings.HasPrefix(r.runbook, RunbookBase+"#") {
			t.Errorf("%s %s: runbook %q, want %q", r.kind, r.event, r.runbook, RunbookURL(r.kind))
		}
	}
	var tested []string
	for _, c := range cases {
		tested = append(tested, c.kind)
	}
	if kinds := Kinds(); !slices.Equal(slices.Sorted(slices.Values(tested)), slices.Sorted(slices.Values(kinds))) {
		t.Errorf("cases cover kinds %v; the alerter raises %v", tested, kinds)
	}
	if e.hook.badSigs != 0 || e.smtp.authFailures != 0 {
		t.Errorf("%d bad webhook signatures, %d refused SMTP logins", e.hook.badSigs, e.smtp.authFailures)
	}
}
