package api

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/partition"
	"github.com/lock-sensors/lock-sensors/internal/rebuild"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
	"github.com/lock-sensors/lock-sensors/projector/history"
	rebuildrunner "github.com/lock-sensors/lock-sensors/projector/rebuild"
	"github.com/lock-sensors/lock-sensors/projector/state"
	locksv1 "github.com/lock-sensors/lock-sensors/proto/locks/v1"
)

const projParts = 4

// projEnv is an API server with a rebuild runner on a private NATS, the env's Postgres (db) and a
// fresh ClickHouse database.
type projEnv struct {
	*env
	nats *testenv.NATSEnv
	ch   driver.Conn
	proj locksv1.ProjectionServiceClient
}

func newProjEnv(t *testing.T) *projEnv {
	t.Helper()
	p := &projEnv{nats: testenv.NATS(t)}
	_, p.ch = testenv.ClickHouse(t)
	if err := natsx.Declare(t.Context(), p.nats.JS, natsx.StreamsConfig{Partitions: projParts, LostAfter: time.Hour}); err != nil {
		t.Fatal(err)
	}
	p.env = newEnv(t, func(_ *Config, d *Deps) {
		log := testenv.Logger(t)
		r, err := rebuildrunner.New(rebuildrunner.Config{PartitionCount: projParts}, rebuildrunner.Deps{JS: p.nats.JS, Logger: log, Projections: []rebuild.Projection{
			state.NewProjection(state.RebuildConfig{PartitionCount: projParts, ProgressEvery: 100 * time.Millisecond, BatchSize: 500},
				state.RebuildDeps{JS: p.nats.JS, PG: d.PG.(*pgxpool.Pool), Logger: log}),
			history.NewProjection(history.RebuildConfig{PartitionCount: projParts}, history.RebuildDeps{JS: p.nats.JS, CH: p.ch, Logger: log}),
		}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(r.Close)
		d.Projections = r
	})
	p.proj = locksv1.NewProjectionServiceClient(p.conn)
	return p
}

// publish appends readings of sensors p0…p(sensors-1) (with a liveness fact now and then)
// and returns each partition's last sequence.
func (p *projEnv) publish(t *testing.T, sensors, count int, lastSeq map[int]uint64) {
	t.Helper()
	base := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	for i := range count {
		id := fmt.Sprintf("p%d", i%sensors)
		at := base.Add(time.Duration(i) * time.Second)
		l := event.Log{V: event.Version, Kind: event.KindReading, SensorID: id, Data: uint8(i / sensors % 2), Time: at, ReceivedTime: at}
		if i%97 == 96 {
			l = event.Log{V: event.Version, Kind: event.KindLivenessTimeout, SensorID: id, Time: at, ReceivedTime: at, LostAfter: time.Second}
		}
		b, _ := json.Marshal(l)
		ack, err := p.nats.JS.Publish(t.Context(), natsx.ReadingsSubject(id), b)
		if err != nil {
			t.Fatal(err)
		}
		pt := partition.Of(id, projParts)
		lastSeq[pt] = max(lastSeq[pt], ack.Sequence)
	}
}

func (p *projEnv) listREST(t *testing.T) map[string]any {
	t.Helper()
	r := p.want(p.do("GET", "/v1/projections", nil), 200)
	out := map[string]any{}
	for _, x := range r.body["projections"].([]any) {
		m := x.(map[string]any)
		out[m["name"].(string)] = m
	}
	return out
}

func (p *projEnv) list(t *testing.T) map[string]*locksv1.Projection {
	t.Helper()
	res, err := p.proj.ListProjections(t.Context(), &locksv1.ListProjectionsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*locksv1.Projection{}
	for _, x := range res.GetProjections() {
		out[x.GetName()] = x
	}
	return out
}

func stateTableText(t *testing.T, pg *pgxpool.Pool) []string {
	t.Helper()
	rows, err := pg.Query(t.Context(), `SELECT s::text FROM sensor_state s ORDER BY sensor_id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	return out
}

// GET /v1/projections shows every partition's checkpoint and lag behind READINGS, before and
// after the projectors ran; a state rebuild started over gRPC runs inside the server, a
// second one while it runs is refused (409 over REST, FAILED_PRECONDITION over gRPC), it is
// followed to its end over REST, and the swapped-in state equals the one before; a history
// rebuild started over REST with from_time ends too.
func TestProjectionsRebuild(t *testing.T) {
	t.Parallel()
	p := newProjEnv(t)
	const sensors, count = 60, 3000
	last := map[int]uint64{}
	p.publish(t, sensors, count, last)

	// Nothing applied yet: checkpoint 0, lag = the partition's messages.
	got := p.list(t)
	var lag uint64
	for _, pt := range got["state"].GetPartitions() {
		if pt.GetCheckpoint() != 0 || pt.GetLastSeq() != last[int(pt.GetPartition())] {
			t.Errorf("state partition %d before the projector: %+v, want checkpoint 0, last_seq %d", pt.GetPartition(), pt, last[int(pt.GetPartition())])
		}
		lag += pt.GetLag()
	}
	if len(got["state"].GetPartitions()) != projParts || lag != count || got["state"].GetLag() != count || got["history"].GetLag() != count {
		t.Fatalf("before the projectors: state %v, history lag %d; want %d partitions with a lag of %d in all", got["state"], got["history"].GetLag(), projParts, count)
	}

	st, err := state.New(state.Config{Partitions: partition.All(projParts), PartitionCount: projParts, IdleWait: 100 * time.Millisecond,
		RelayPoll: 50 * time.Millisecond}, state.Deps{JS: p.nats.JS, PG: p.db, Logger: testenv.Logger(t), Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	testenv.RunPart(t, "State", st.Run, 20*time.Second)
	hist, err := history.New(history.Config{Partitions: partition.All(projParts), BatchSize: 1000, FlushInterval: 100 * time.Millisecond},
		history.Deps{JS: p.nats.JS, CH: p.ch, Logger: testenv.Logger(t), Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	testenv.RunPart(t, "History", hist.Run, 20*time.Second)

	// Caught up (REST): every checkpoint at its partition's last sequence, no lag.
	testenv.Eventually(t, 60*time.Second, "projectors caught up", func() bool {
		all := p.listREST(t)
		for _, name := range []string{"state", "history"} {
			m := all[name].(map[string]any)
			if m["lag"] != "0" {
				return false
			}
			for _, x := range m["partitions"].([]any) {
				pt := x.(map[string]any)
				if pt["checkpoint"] != fmt.Sprint(last[int(pt["partition"].(float64))]) || pt["checkpoint"] != pt["last_seq"] {
					t.Fatalf("%s partition %v: lag 0 but checkpoint %v, last_seq %v, published up to %d", name, pt["partition"], pt["checkpoint"], pt["last_seq"], last[int(pt["partition"].(float64))])
				}
			}
		}
		return p.count(`SELECT count(*) FROM outbox`) == 0
	})
	before := stateTableText(t, p.db)
	if len(before) != sensors {
		t.Fatalf("%d sensor_state rows, want %d", len(before), sensors)
	}

	// Hold the rebuild at its start (the lock it takes before creating the shadow) so that
	// it is surely running when the second request comes.
	hold, err := p.db.Acquire(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := hold.Exec(t.Context(), `SELECT pg_advisory_lock(hashtext('locks.rebuild.state'))`); err != nil {
		t.Fatal(err)
	}
	started, err := p.proj.RebuildProjection(t.Context(), &locksv1.RebuildProjectionRequest{Name: "state"})
	if err != nil {
		t.Fatal(err)
	}
	if r := started.GetRebuild(); !r.GetRunning() || r.GetPhase() != locksv1.RebuildPhase_REBUILD_PHASE_STARTING || r.GetStartTime() == nil {
		t.Fatalf("started: %v", r)
	}
	p.want(p.do("POST", "/v1/projections/state:rebuild", map[string]any{}), 409, "a rebuild of this projection is running", "state")
	_, err = p.proj.RebuildProjection(t.Context(), &locksv1.RebuildProjectionRequest{Name: "state", FromSeq: 5})
	wantCode(t, err, codes.FailedPrecondition, "running")
	if r := p.list(t)["state"].GetRebuild(); !r.GetRunning() {
		t.Fatalf("listed while held: %v", r)
	}
	if _, err := hold.Exec(t.Context(), `SELECT pg_advisory_unlock(hashtext('locks.rebuild.state'))`); err != nil {
		t.Fatal(err)
	}
	hold.Release()

	// Followed over REST to its end.
	var done map[string]any
	testenv.Eventually(t, 60*time.Second, "state rebuild done", func() bool {
		rb, _ := p.listREST(t)["state"].(map[string]any)["rebuild"].(map[string]any)
		if rb["phase"] == "REBUILD_PHASE_FAILED" {
			t.Fatalf("rebuild failed: %v", rb)
		}
		done = rb
		return rb["phase"] == "REBUILD_PHASE_DONE"
	})
	if done["running"] != false || done["done"] != fmt.Sprint(count) || done["total"] != fmt.Sprint(count) || done["finish_time"] == nil ||
		!strings.HasPrefix(done["old_table"].(string), state.OldTablePrefix) || done["error"] != "" {
		t.Errorf("finished rebuild: %v", done)
	}
	if after := stateTableText(t, p.db); strings.Join(after, "\n") != strings.Join(before, "\n") {
		t.Errorf("rebuilt sensor_state differs from the one before:\n%v\nwant\n%v", after, before)
	}
	if _, ok := p.list(t)[state.ShadowName]; ok {
		t.Error("the shadow's checkpoints are still listed after the swap")
	}

	// History, from a time before the log (REST), followed over gRPC.
	r := p.want(p.do("POST", "/v1/projections/history:rebuild", map[string]any{"from_time": "2020-01-01T00:00:00Z"}), 200)
	if r.str("projection") != "history" || r.body["from_seq"] != "1" {
		t.Fatalf("history rebuild: %s", r.raw)
	}
	testenv.Eventually(t, 60*time.Second, "history rebuild done", func() bool {
		rb := p.list(t)["history"].GetRebuild()
		if rb.GetPhase() == locksv1.RebuildPhase_REBUILD_PHASE_FAILED {
			t.Fatalf("history rebuild failed: %v", rb)
		}
		return rb.GetPhase() == locksv1.RebuildPhase_REBUILD_PHASE_DONE
	})
	var rows uint64
	if err := p.ch.QueryRow(t.Context(), `SELECT toUInt64(count()) FROM (SELECT DISTINCT seq FROM readings)`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if want := uint64(count - count/97); rows != want {
		t.Errorf("rebuilt readings table: %d rows, want %d", rows, want)
	}
}

// Bad requests name the field; a server without a runner answers UNIMPLEMENTED (501).
func TestProjectionsValidation(t *testing.T) {
	t.Parallel()
	p := newProjEnv(t)
	p.publish(t, 3, 10, map[int]uint64{})
	for _, c := range []struct {
		path  string
		body  any
		field string
		words string
	}{
		{"/v1/projections/nope:rebuild", map[string]any{}, "name", "want state or history"},
		{"/v1/projections/state:rebuild", map[string]any{"from_seq": 3, "from_time": "2026-01-01T00:00:00Z"}, "from_time", "exclude each other"},
		{"/v1/projections/state:rebuild", map[string]any{"from_time": "2999-01-01T00:00:00Z"}, "from_time", "no message at or after"},
	} {
		r := p.want(p.do("POST", c.path, c.body), 400, c.words)
		if f := fieldOf(r); f != c.field {
			t.Errorf("POST %s %v: field %q, want %q", c.path, c.body, f, c.field)
		}
	}
	_, err := p.proj.RebuildProjection(t.Context(), &locksv1.RebuildProjectionRequest{Name: "history", FromSeq: 1, FromTime: timestamppb.Now()})
	wantCode(t, err, codes.InvalidArgument, "exclude each other")
	if _, ok := p.list(t)["history"]; !ok {
		t.Fatal("no history projection listed")
	}

	bare := newEnv(t)
	bare.want(bare.do("GET", "/v1/projections", nil), 501, "no rebuild runner")
	_, err = locksv1.NewProjectionServiceClient(bare.conn).RebuildProjection(context.Background(), &locksv1.RebuildProjectionRequest{Name: "state"})
	wantCode(t, err, codes.Unimplemented)
}
