package notifier

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// The janitor deletes finished rows older than Retention and dead rows older than
// DeadRetention; younger rows, and pending rows of any age, stay. With KeepUntilRedriven a
// dead row stays whatever its age.
func TestRetentionDeletesExpiredRows(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rows := []struct {
		state string
		age   time.Duration
		kept  bool
	}{
		{"delivered", 8 * 24 * time.Hour, false},
		{"superseded", 8 * 24 * time.Hour, false},
		{"cancelled", 8 * 24 * time.Hour, false},
		{"delivered", 6 * 24 * time.Hour, true},
		{"dead", 91 * 24 * time.Hour, false},
		{"dead", 30 * 24 * time.Hour, true},
		{"pending", 365 * 24 * time.Hour, true},
	}
	var want []string
	for i, r := range rows {
		id := fmt.Sprintf("evt_%d_%s", i, r.state)
		e.exec(`INSERT INTO notifier_deliveries (event_id, client_id, sensor_id, revision, payload, state, updated_at)
			VALUES ($1, 'C1', $2, 1, '\x7b7d', $3, now() - $4 * interval '1 microsecond')`,
			id, fmt.Sprintf("S%d", i), r.state, r.age.Microseconds())
		if r.kept {
			want = append(want, id)
		}
	}
	left := func() []string {
		var ids []string
		rs, err := e.pool.Query(context.Background(), `SELECT event_id FROM notifier_deliveries ORDER BY event_id`)
		if err != nil {
			t.Fatal(err)
		}
		defer rs.Close()
		for rs.Next() {
			var id string
			if err := rs.Scan(&id); err != nil {
				t.Fatal(err)
			}
			ids = append(ids, id)
		}
		return ids
	}
	e.start() // default retentions: 7 days finished, 90 days dead
	testenv.Eventually(t, 20*time.Second, "the janitor to delete rows past their retention", func() bool {
		return slices.Equal(left(), want)
	})

	// An operator keeping dead letters until redriven.
	e.exec(`INSERT INTO notifier_deliveries (event_id, client_id, sensor_id, revision, payload, state, updated_at)
		VALUES ('evt_old_dead', 'C1', 'S9', 1, '\x7b7d', 'dead', now() - interval '1000 days')`)
	cfg := e.cfg
	cfg.DeadRetention = KeepUntilRedriven
	cfg.setDefaults()
	n := &Notifier{cfg: cfg, db: e.pool, log: testenv.Logger(t)}
	if _, dead, err := n.deleteExpired(t.Context()); err != nil || dead != 0 {
		t.Fatalf("with KeepUntilRedriven: %d dead rows deleted, %v", dead, err)
	}
	if !slices.Contains(left(), "evt_old_dead") {
		t.Fatal("a dead row was deleted although dead letters are kept until redriven")
	}
}
