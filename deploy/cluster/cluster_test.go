package cluster_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"

	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/lock-sensors/lock-sensors/deploy/cluster"
	"github.com/lock-sensors/lock-sensors/internal/partition"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// The topology end to end: 3 clustered NATS nodes with users, 2 processes of each part; a
// client without credentials is refused, and readings pushed through RabbitMQ come out as
// webhooks from sensors of both state processes' partitions.
func TestClusterSmoke(t *testing.T) {
	locks := testenv.Build(t, "./cmd/locks")
	node := testenv.Build(t, "./deploy/cluster/natsnode")
	root, _ := filepath.Abs("../..")

	const partitions, token = 4, "cluster-smoke-token-0123456789"
	rabbit := testenv.RabbitMQ(t)
	chDB := testenv.Name("locks_cluster")
	t.Cleanup(func() { testenv.DropClickHouseDatabase(t, chDB) })
	out := &testenv.LogBuffer{}
	c, err := cluster.Start(t.Context(), cluster.Config{
		Dir: t.TempDir(), LocksBin: locks, NodeBin: node, Accounts: cluster.Accounts(root), Out: out,
		// The test's own fsync policy: three nodes fsyncing every write on a shared 2-core machine
		// would test the disk, not the topology.
		Sync: "1s",
		Env: []string{
			"LOCKS_POSTGRES_URL=" + testenv.PostgresURL(t),
			"LOCKS_CLICKHOUSE_URL=clickhouse://" + testenv.ClickHouseAddr() + "/" + chDB,
			"LOCKS_AMQP_URL=" + rabbit.URL, "LOCKS_AMQP_QUEUE=" + rabbit.Queue,
			"LOCKS_API_TOKENS=" + token, "LOCKS_PARTITIONS=" + fmt.Sprint(partitions),
			"LOCKS_WEBHOOK_ALLOW_PRIVATE=true", "LOCKS_RETRY_SCHEDULE=200ms,400ms",
		},
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	t.Cleanup(func() {
		c.Stop()
		if t.Failed() {
			t.Logf("cluster output:\n%s", out.String())
		}
	})
	if len(c.Nodes) != 3 || len(c.Parts) != 14 {
		t.Fatalf("%d nodes and %d locks processes, want 3 and 14", len(c.Nodes), len(c.Parts))
	}

	// Auth: no credentials, no connection; the admin user sees a 3-peer JetStream cluster.
	var anon []string
	for _, u := range strings.Split(c.NATSURL(cluster.AdminUser), ",") {
		i, j := strings.Index(u, "//"), strings.Index(u, "@")
		anon = append(anon, u[:i+2]+u[j+1:])
	}
	if nc, err := nats.Connect(strings.Join(anon, ","), nats.MaxReconnects(0)); err == nil {
		nc.Close()
		t.Fatal("a client without credentials connected")
	}
	nc, err := nats.Connect(c.NATSURL(cluster.AdminUser))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	msg, err := nc.Request("$JS.API.INFO", nil, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(msg.Data), `"api"`) {
		t.Fatalf("JetStream account info: %s", msg.Data)
	}

	// A sensor in each state process's share of the partitions.
	api := "http://" + c.Of("api")[0].HTTPAddr
	rcv := newReceiver(t)
	var client struct {
		ID string `json:"id"`
	}
	call(t, api, token, "POST", "/v1/clients", map[string]string{"name": "smoke", "webhook_url": rcv.URL + "/hook"}, &client)
	owned := map[int]bool{}
	var sensors []string
	for i := 0; len(owned) < 2 || len(sensors) < 4; i++ {
		id := fmt.Sprintf("door%d", i)
		owned[partition.Of(id, partitions)%2] = true
		sensors = append(sensors, id)
	}
	for _, id := range sensors {
		call(t, api, token, "POST", "/v1/sensors", map[string]string{"id": id, "address": "Svobody st. " + id}, nil)
		call(t, api, token, "PUT", "/v1/sensors/"+id+"/clients/"+client.ID, nil, nil)
	}
	conn, err := amqp.Dial(rabbit.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range sensors {
		body := fmt.Sprintf(`{"sensor_id":%q,"data":1,"ts":%q}`, id, time.Now().UTC().Format(time.RFC3339Nano))
		if err := ch.PublishWithContext(t.Context(), "", rabbit.Queue, false, false,
			amqp.Publishing{DeliveryMode: amqp.Persistent, ContentType: "application/json", Body: []byte(body)}); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, 60*time.Second, "a webhook for every sensor", func() bool {
		return len(rcv.sensors()) == len(sensors)
	})
	got := rcv.sensors()
	for _, id := range sensors {
		if got[id] != 1 {
			t.Errorf("sensor %s: %d webhooks, want 1", id, got[id])
		}
	}

	// Issue 25, item 2, on the clustered servers: the api and history users may not delete,
	// pause or reset the notifier's EVENTS consumer, nor write its processes' registry keys.
	var notifierConsumer string
	for p := range partitions {
		if _, err := nc.Request("$JS.API.CONSUMER.INFO.EVENTS.notifier-"+fmt.Sprint(p), nil, 5*time.Second); err == nil {
			notifierConsumer = "notifier-" + fmt.Sprint(p)
			break
		}
	}
	if notifierConsumer == "" {
		t.Fatal("no notifier consumer on EVENTS")
	}
	// Side by side: a refused request is answered by no one and waits out its timeout.
	var wg sync.WaitGroup
	for _, user := range []string{"api", "history"} {
		unc, err := nats.Connect(c.NATSURL(user), nats.CustomInboxPrefix("_INBOX_"+user), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
		if err != nil {
			t.Fatal(err)
		}
		defer unc.Close()
		for _, subj := range []string{
			"$JS.API.CONSUMER.DELETE.EVENTS." + notifierConsumer,
			"$JS.API.CONSUMER.PAUSE.EVENTS." + notifierConsumer,
			"$JS.API.CONSUMER.RESET.EVENTS." + notifierConsumer,
			"$JS.API.CONSUMER.LEADER.STEPDOWN.EVENTS." + notifierConsumer,
			"$KV.processes.notifier.forged",
		} {
			wg.Go(func() {
				if _, err := unc.Request(subj, []byte(`{}`), time.Second); err == nil {
					t.Errorf("the %s user's request to %s was answered", user, subj)
				}
			})
		}
	}
	wg.Wait()
	if msg, err := nc.Request("$JS.API.CONSUMER.INFO.EVENTS."+notifierConsumer, nil, 5*time.Second); err != nil ||
		strings.Contains(string(msg.Data), `"error"`) || strings.Contains(string(msg.Data), `"paused":true`) {
		t.Fatalf("the notifier's consumer after the attempts: %v %s", err, msg.Data)
	}
}

func call(t *testing.T, base, token, method, path string, in, out any) {
	t.Helper()
	var body io.Reader
	if in != nil {
		b, _ := json.Marshal(in)
		body = bytes.NewReader(b)
	}
	req, _ := http.NewRequestWithContext(t.Context(), method, base+path, body)
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, b)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s %s: %v in %s", method, path, err, b)
		}
	}
}

// receiver counts webhooks per sensor.
type receiver struct {
	*httptest.Server
	mu  sync.Mutex
	got map[string]int
}

func newReceiver(t *testing.T) *receiver {
	r := &receiver{got: map[string]int{}}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		var p struct{ Sensor struct{ ID string } }
		b, _ := io.ReadAll(req.Body)
		if err := json.Unmarshal(b, &p); err != nil {
			t.Errorf("webhook body: %v: %s", err, b)
		}
		r.mu.Lock()
		r.got[p.Sensor.ID]++
		r.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(r.Close)
	return r
}

func (r *receiver) sensors() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := map[string]int{}
	for k, v := range r.got {
		m[k] = v
	}
	return m
}
