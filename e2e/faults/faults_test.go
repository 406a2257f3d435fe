package faults_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lock-sensors/lock-sensors/deploy/cluster"

	"github.com/lock-sensors/lock-sensors/internal/backoff"
	"github.com/lock-sensors/lock-sensors/internal/lease"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// nodeDown is how long a killed NATS node stays down.
const nodeDown = 30 * time.Second

// SIGKILL the READINGS stream's leader, keep it down 30 s, restart it.
func TestFaultNATSLeaderKilled(t *testing.T) {
	requireFaults(t)
	r := startRun(t, localServers(t), 90*time.Second)
	r.warm()
	info, err := r.js.Stream(t.Context(), natsx.ReadingsStream)
	if err != nil {
		t.Fatal(err)
	}
	si, err := info.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if si.Config.Replicas != 3 || si.Cluster == nil {
		t.Fatalf("READINGS has %d replicas, want 3", si.Config.Replicas)
	}
	r.killNode(r.c.NodeIndex(si.Cluster.Leader), "the READINGS leader")
	r.finish()
}

// SIGKILL the node the notifier (and whatever else is there) is connected to, keep it down
// 30 s, restart it.
func TestFaultNATSConnectedNodeKilled(t *testing.T) {
	requireFaults(t)
	r := startRun(t, localServers(t), 90*time.Second)
	r.warm()
	best, most := -1, 0
	for i := range r.c.Nodes {
		users := connectedUsers(t, r.c.NodeMonitor(i))
		if users["notifier"] > 0 && len(users) > most {
			best, most = i, len(users)
		}
		t.Logf("%s: connections by user %v", r.c.Nodes[i].Name, users)
	}
	if best < 0 {
		t.Fatal("no node has a notifier connection")
	}
	r.killNode(best, "the node a notifier is connected to")
	r.finish()
}

// killNode SIGKILLs node i, keeps it down nodeDown, restarts it, and logs how long the
// committed readings stood still around the kill.
func (r *run) killNode(i int, what string) {
	t := r.t
	n := r.c.Nodes[i]
	t.Logf("SIGKILL %s, %s", n.Name, what)
	leaderless := r.watchSpans(r.streamsLed, r.metaLed())
	at := time.Now()
	if err := n.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-n.Done()
	if !backoff.Sleep(t.Context(), nodeDown) {
		t.Fatal("the test ended while the node was down")
	}
	if err := r.c.RestartNode(t.Context(), i); err != nil {
		t.Fatal(err)
	}
	// What the kill cost: the longest stills from the kill until the flow is surely back.
	backoff.Sleep(t.Context(), 15*time.Second)
	spans := leaderless()
	none, s, m := spans[2], spans[0], spans[1]
	state, hooks := r.stallsWithin(at, time.Now())
	t.Logf("%s restarted after %s; around the kill committed readings stood still %s and webhooks %s; NATS had no leader for %s (READINGS or EVENTS %s, the JetStream meta group %s)",
		n.Name, time.Since(at).Round(time.Second), state, hooks, none.Round(100*time.Millisecond), s.Round(100*time.Millisecond), m.Round(100*time.Millisecond))
	// The parts resume within 3 s of NATS having a leader again for what they need: READINGS
	// and EVENTS, and the meta group, without which no consumer whose own leader died with the
	// node can be created again. The samples are a second apart, so a still is measured up to
	// a second long.
	if limit := none + 4*time.Second; state > limit || hooks > limit {
		t.Errorf("committed readings stood still %s and webhooks %s: more than NATS's own leaderless %s plus 3 s", state, hooks, none)
	}
}

// streamsLed says whether READINGS and EVENTS both have a leader that answers.
func (r *run) streamsLed(ctx context.Context) bool {
	for _, name := range []string{natsx.ReadingsStream, natsx.EventsStream} {
		qctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		st, err := r.js.Stream(qctx, name)
		cancel()
		if err != nil || st.CachedInfo().Cluster == nil || st.CachedInfo().Cluster.Leader == "" {
			return false
		}
	}
	return true
}

// metaLed says, from the nodes' /jsz, whether the JetStream meta group has a leader that says
// so itself (a follower names a dead leader for a while).
func (r *run) metaLed() func(context.Context) bool {
	client := &http.Client{Timeout: 300 * time.Millisecond}
	leaderOf := func(ctx context.Context, i int) string {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.c.NodeMonitor(i)+"/jsz", nil)
		if err != nil {
			return ""
		}
		resp, err := client.Do(req)
		if err != nil {
			return ""
		}
		defer resp.Body.Close()
		var jz struct {
			Meta struct {
				Leader string `json:"leader"`
			} `json:"meta_cluster"`
		}
		if json.NewDecoder(resp.Body).Decode(&jz) != nil {
			return ""
		}
		return jz.Meta.Leader
	}
	return func(ctx context.Context) bool {
		for i := range r.c.Nodes {
			if l := leaderOf(ctx, i); l != "" {
				if j := r.c.NodeIndex(l); j >= 0 && leaderOf(ctx, j) == l {
					return true
				}
			}
		}
		return false
	}
}

// watchSpans asks each of led every 100 ms until the returned function is called, which
// gives, for each, the longest span in which it said false, and last the longest span in
// which any of them did (from the same samples).
func (r *run) watchSpans(led ...func(context.Context) bool) func() []time.Duration {
	ctx, stop := context.WithCancel(r.t.Context())
	done := make(chan []time.Duration, 1)
	go func() {
		worst := make([]time.Duration, len(led)+1)
		since := make([]time.Time, len(led)+1) // the start of each current span without a leader
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			ok := make([]bool, len(led)+1)
			ok[len(led)] = true
			for i, f := range led {
				ok[i] = f(ctx)
				ok[len(led)] = ok[len(led)] && ok[i]
			}
			now := time.Now()
			for i := range ok {
				if ok[i] {
					since[i] = time.Time{}
				} else if since[i].IsZero() {
					since[i] = now
				}
				if !since[i].IsZero() {
					worst[i] = max(worst[i], now.Sub(since[i]))
				}
			}
			select {
			case <-ctx.Done():
				done <- worst
				return
			case <-tick.C:
			}
		}
	}()
	return func() []time.Duration { stop(); return <-done }
}

// connectedUsers counts a node's client connections by NATS user, from its /connz.
func connectedUsers(t *testing.T, monitor string) map[string]int {
	resp, err := http.Get(monitor + "/connz?auth=1&limit=1000")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var cz struct {
		Connections []struct {
			User string `json:"authorized_user"`
		} `json:"connections"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&cz); err != nil {
		t.Fatal(err)
	}
	users := map[string]int{}
	for _, c := range cz.Connections {
		users[c.User]++
	}
	return users
}

// owners reads who owns each partition of part (state, notifier, watchdog) in the fence.
func owners(ctx context.Context, pg *pgxpool.Pool, part string) (map[int]string, error) {
	rows, err := pg.Query(ctx, "SELECT partition, owner FROM partition_owners WHERE projection = $1", part)
	if err != nil {
		return nil, err
	}
	m := map[int]string{}
	var p int
	var o string
	_, err = pgx.ForEachRow(rows, []any{&p, &o}, func() error { m[p] = o; return nil })
	return m, err
}

// ownedBy says whether owner is the lease owner id of the process with pid (lease.NewOwner:
// host-pid-random).
func ownedBy(owner string, pid int) bool { return strings.Contains(owner, fmt.Sprintf("-%d-", pid)) }

// bothOwn says whether each process of part owns partitions.
func bothOwn(c *cluster.Cluster, part string) bool {
	for _, p := range c.Of(part) {
		if metric(p, "locks_lease_partitions") < 1 {
			return false
		}
	}
	return true
}

// takeover polls the fence of part until every partition has an owner and none is the
// process with pid, and returns how long that took from since.
func takeover(ctx context.Context, pg *pgxpool.Pool, part string, pid int, since time.Time, within time.Duration) (time.Duration, error) {
	for {
		m, err := owners(ctx, pg, part)
		if err == nil && len(m) == partitions {
			left := 0
			for _, o := range m {
				if ownedBy(o, pid) {
					left++
				}
			}
			if left == 0 {
				return time.Since(since), nil
			}
		}
		if time.Since(since) > within {
			return 0, fmt.Errorf("the partitions of pid %d were not taken over within %s: %v (%v)", pid, within, m, err)
		}
		if !backoff.Sleep(ctx, 100*time.Millisecond) {
			return 0, ctx.Err()
		}
	}
}

// victim waits until both processes of part own partitions and returns the first.
func (r *run) victim(part string) *cluster.Part {
	r.warm()
	testenv.Eventually(r.t, time.Minute, "both "+part+" processes to own partitions", func() bool {
		return bothOwn(r.c, part)
	})
	return r.c.Of(part)[0]
}

// SIGKILL one of the two state processes: the other takes its partitions within 10 s.
func TestFaultStateProcessKilled(t *testing.T) {
	requireFaults(t)
	r := startRun(t, localServers(t), 60*time.Second)
	r.killTakenOver("state")
	r.finish()
}

// killTakenOver SIGKILLs the first process of part once both own partitions, fails the test
// unless the other owns all of them within 10 s, and returns the partitions the killed one
// owned and when the other owned them all.
func (r *run) killTakenOver(part string) ([]int, time.Time) {
	t := r.t
	victim := r.victim(part)
	pid := victim.Cmd.Process.Pid
	m, err := owners(t.Context(), r.pg, part)
	if err != nil {
		t.Fatal(err)
	}
	var had []int
	for p, o := range m {
		if ownedBy(o, pid) {
			had = append(had, p)
		}
	}
	slices.Sort(had)
	at := time.Now()
	if err := victim.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	took, err := takeover(t.Context(), r.pg, part, pid, at, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("SIGKILL %s (owned partitions %v): taken over in %s (LOCKS_LEASE_TTL %s)", victim.Name, had, took.Round(10*time.Millisecond), lease.TTLDefault)
	if took > 10*time.Second {
		t.Errorf("takeover took %s, want within 10 s", took)
	}
	return had, at.Add(took)
}

// SIGSTOP a state process past its lease, then SIGCONT: it commits nothing for the
// partitions it lost. Every checkpoint write is logged by a trigger with the writer's
// Postgres application_name (PGAPPNAME, set per process by the cluster) and the time it
// ran: none of the paused process's may run after its partitions were all taken over (a
// write in flight at SIGSTOP ran before: the claim waits for its transaction).
func TestFaultStateProcessPaused(t *testing.T) {
	requireFaults(t)
	r := startRun(t, localServers(t), 60*time.Second)
	if _, err := r.pg.Exec(t.Context(), `
		CREATE TABLE checkpoint_writes (partition int, seq bigint, writer text, at timestamptz);
		CREATE FUNCTION log_checkpoint_write() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			INSERT INTO checkpoint_writes VALUES (NEW.partition, NEW.seq, current_setting('application_name'), clock_timestamp());
			RETURN NEW;
		END $$;
		CREATE TRIGGER checkpoint_writes AFTER INSERT OR UPDATE ON checkpoints
			FOR EACH ROW WHEN (NEW.projection = 'state') EXECUTE FUNCTION log_checkpoint_write();
		CREATE TABLE partition_claims (partition int, owner text, at timestamptz);
		CREATE FUNCTION log_partition_claim() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			INSERT INTO partition_claims VALUES (NEW.partition, NEW.owner, clock_timestamp());
			RETURN NEW;
		END $$;
		CREATE TRIGGER partition_claims AFTER INSERT OR UPDATE ON partition_owners
			FOR EACH ROW WHEN (NEW.projection = 'state') EXECUTE FUNCTION log_partition_claim();`); err != nil {
		t.Fatal(err)
	}
	victim := r.victim("state")
	pid := victim.Cmd.Process.Pid
	lost0 := metric(victim, "locks_lease_lost_total")
	at := time.Now()
	if err := victim.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	took, err := takeover(t.Context(), r.pg, "state", pid, at, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var takenOver time.Time
	if err := r.pg.QueryRow(t.Context(), `SELECT clock_timestamp()`).Scan(&takenOver); err != nil {
		t.Fatal(err)
	}
	// Past the lease by a margin, so that the process wakes with every lease long gone.
	if !backoff.Sleep(t.Context(), max(0, 2*lease.TTLDefault-time.Since(at))) {
		t.Fatal("the test ended while the process was stopped")
	}
	stopped := time.Since(at)
	if err := victim.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 3*lease.TTLDefault, victim.Name+" to count its lost partitions", func() bool {
		return metric(victim, "locks_lease_lost_total") > lost0
	})
	res := r.finish()
	var before, after, others int
	var firstAfter *time.Time
	// After the takeover, a write of the paused process to a partition is one only if it
	// claimed that partition again before it.
	if err := r.pg.QueryRow(t.Context(), `WITH w AS (SELECT *, at > $2 AND NOT EXISTS (SELECT 1 FROM partition_claims c
			WHERE c.partition = w.partition AND c.owner LIKE $3 AND c.at > $2 AND c.at < w.at) AS unowned FROM checkpoint_writes w)
		SELECT count(*) FILTER (WHERE writer = $1 AND at <= $2), count(*) FILTER (WHERE writer = $1 AND unowned),
			count(*) FILTER (WHERE writer <> $1 AND at > $2), min(at) FILTER (WHERE writer = $1 AND unowned) FROM w`,
		victim.Name, takenOver, fmt.Sprintf("%%-%d-%%", pid)).Scan(&before, &after, &others, &firstAfter); err != nil {
		t.Fatal(err)
	}
	t.Logf("SIGSTOP %s for %s: its partitions taken over in %s; checkpoint writes: %d by it before the takeover, %d by it after without claiming again, %d by the others after (%d events)",
		victim.Name, stopped.Round(100*time.Millisecond), took.Round(10*time.Millisecond), before, after, others, res.events)
	if before == 0 || others == 0 {
		t.Errorf("the trigger saw %d writes of %s and %d of the others: it shows nothing", before, victim.Name, others)
	}
	if after > 0 {
		t.Errorf("%s wrote %d checkpoints of partitions it had lost (first at %v, takeover seen at %v)", victim.Name, after, firstAfter, takenOver)
	}
}
