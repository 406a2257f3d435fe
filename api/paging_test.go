package api

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/lock-sensors/lock-sensors/internal/testenv"
	locksv1 "github.com/lock-sensors/lock-sensors/proto/locks/v1"
)

const idChars = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"

func randomSensorID(r *rand.Rand) string {
	b := make([]byte, 1+r.IntN(16))
	for i := range b {
		b[i] = idChars[r.IntN(len(idChars))]
	}
	return string(b)
}

// Walking every page while sensors are being registered never repeats a sensor and never
// misses one that was there when the walk began.
func TestPagingWhileInsertingSensors(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := t.Context()
	r := rand.New(rand.NewPCG(1, 2))
	start := map[string]bool{}
	for len(start) < 400 {
		id := randomSensorID(r)
		if _, err := e.db.Exec(ctx, `INSERT INTO sensors (id, address) VALUES ($1, 'x') ON CONFLICT DO NOTHING`, id); err != nil {
			t.Fatal(err)
		}
		start[id] = true
	}

	// A writer registers sensors through the API all along the walk.
	wctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var added atomic.Int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		r := rand.New(rand.NewPCG(3, 4))
		for wctx.Err() == nil {
			id := randomSensorID(r)
			if _, err := e.sensors.CreateSensor(wctx, &locksv1.CreateSensorRequest{Sensor: &locksv1.Sensor{Id: id, Address: "new"}}); err == nil {
				added.Add(1)
			}
		}
	}()

	// The walk starts once the writer has registered one: on a busy machine its first call
	// can take as long as the whole walk.
	testenv.Eventually(t, 30*time.Second, "the writer's first sensor", func() bool { return added.Load() > 0 })
	before := added.Load()

	seen := map[string]int{}
	last := ""
	token := ""
	pages := 0
	for {
		q := url.Values{"page_size": {"17"}}
		if token != "" {
			q.Set("page_token", token)
		}
		res := e.want(e.do("GET", "/v1/sensors?"+q.Encode(), nil), 200)
		list, _ := res.body["sensors"].([]any)
		for _, s := range list {
			id := s.(map[string]any)["id"].(string)
			seen[id]++
			if seen[id] > 1 {
				t.Fatalf("sensor %s listed twice", id)
			}
			last = id
		}
		pages++
		token = res.str("next_page_token")
		if token == "" {
			break
		}
		if len(list) != 17 {
			t.Fatalf("page %d has %d sensors but is not the last", pages, len(list))
		}
		// Also insert right at the cursor, where an offset-based pager would shift.
		if _, err := e.db.Exec(ctx, `INSERT INTO sensors (id, address) VALUES ($1, 'x') ON CONFLICT DO NOTHING`, last[:len(last)-1]); err != nil {
			t.Fatal(err)
		}
	}
	stop()
	wg.Wait()
	for id := range start {
		if seen[id] != 1 {
			t.Fatalf("sensor %s that existed at the start was listed %d times", id, seen[id])
		}
	}
	during := added.Load() - before
	if during == 0 {
		t.Fatal("the writer added nothing during the walk: the test proved nothing")
	}
	t.Logf("%d pages, %d sensors at the start, %d listed, %d registered during the walk", pages, len(start), len(seen), during)
}

// The same over gRPC for clients, whose ids are random, so new ones land all over the order.
func TestPagingWhileInsertingClients(t *testing.T) {
	t.Parallel()
	e := newEnv(t, withPrivateWebhooks())
	ctx := t.Context()
	create := func() string {
		c, err := e.clients.CreateClient(ctx, &locksv1.CreateClientRequest{Client: &locksv1.Client{Name: "c", WebhookUrl: "http://127.0.0.1:1/"}})
		if err != nil {
			t.Fatal(err)
		}
		return c.GetClient().GetId()
	}
	start := map[string]bool{}
	for range 120 {
		start[create()] = true
	}
	seen := map[string]bool{}
	token := ""
	for {
		res, err := e.clients.ListClients(ctx, &locksv1.ListClientsRequest{PageSize: 11, PageToken: token})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range res.GetClients() {
			if seen[c.GetId()] {
				t.Fatalf("client %s listed twice", c.GetId())
			}
			seen[c.GetId()] = true
		}
		for range 3 {
			create()
		}
		if token = res.GetNextPageToken(); token == "" {
			break
		}
	}
	for id := range start {
		if !seen[id] {
			t.Fatalf("client %s that existed at the start was not listed", id)
		}
	}
}

func TestPagingSizesAndScopes(t *testing.T) {
	t.Parallel()
	e := newEnv(t, withPrivateWebhooks())
	ctx := t.Context()
	if _, err := e.db.Exec(ctx, `INSERT INTO sensors (id, address) SELECT 'P' || lpad(g::text, 5, '0'), 'x' FROM generate_series(1, 1005) g`); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		size int32
		want int
	}{{0, 100}, {1, 1}, {1000, 1000}, {5000, 1000}} {
		res, err := e.sensors.ListSensors(ctx, &locksv1.ListSensorsRequest{PageSize: c.size})
		if err != nil || len(res.GetSensors()) != c.want || res.GetNextPageToken() == "" {
			t.Fatalf("page_size %d: %d sensors, %v; want %d and a next page", c.size, len(res.GetSensors()), err, c.want)
		}
	}
	// The last page has no token.
	res, err := e.sensors.ListSensors(ctx, &locksv1.ListSensorsRequest{PageSize: 1000})
	if err != nil {
		t.Fatal(err)
	}
	res, err = e.sensors.ListSensors(ctx, &locksv1.ListSensorsRequest{PageSize: 1000, PageToken: res.GetNextPageToken()})
	if err != nil || len(res.GetSensors()) != 5 || res.GetNextPageToken() != "" || res.GetSensors()[0].GetId() != "P01001" {
		t.Fatalf("last page: %d sensors from %s, token %q, %v", len(res.GetSensors()), res.GetSensors()[0].GetId(), res.GetNextPageToken(), err)
	}

	// A token is bound to its list and filters.
	lost := &locksv1.ListSensorsRequest{PageSize: 1, Connection: locksv1.Connection_CONNECTION_LOST}
	for _, id := range []string{"P00001", "P00002", "P00003"} {
		e.setState(id, 0, "lost", 1)
	}
	p1, err := e.sensors.ListSensors(ctx, lost)
	if err != nil || p1.GetNextPageToken() == "" {
		t.Fatal(p1, err)
	}
	_, err = e.sensors.ListSensors(ctx, &locksv1.ListSensorsRequest{PageSize: 1, PageToken: p1.GetNextPageToken()})
	wantCode(t, err, codes.InvalidArgument, "page_token", "filters")
	_, err = e.clients.ListClients(ctx, &locksv1.ListClientsRequest{PageToken: p1.GetNextPageToken()})
	wantCode(t, err, codes.InvalidArgument, "page_token")
	lost.PageToken = p1.GetNextPageToken()
	p2, err := e.sensors.ListSensors(ctx, lost)
	if err != nil || len(p2.GetSensors()) != 1 || p2.GetSensors()[0].GetId() != "P00002" {
		t.Fatalf("second page of lost sensors: %v %v", p2, err)
	}

	// A client's sensors and a sensor's clients page too.
	c, err := e.clients.CreateClient(ctx, &locksv1.CreateClientRequest{Client: &locksv1.Client{Name: "c", WebhookUrl: "http://127.0.0.1:1/"}})
	if err != nil {
		t.Fatal(err)
	}
	cl := c.GetClient().GetId()
	for i := 1; i <= 10; i++ {
		if _, err := e.subs.CreateSubscription(ctx, &locksv1.CreateSubscriptionRequest{SensorId: fmt.Sprintf("P%05d", i), ClientId: cl}); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	token := ""
	for {
		res, err := e.subs.ListClientSensors(ctx, &locksv1.ListClientSensorsRequest{ClientId: cl, PageSize: 3, PageToken: token})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range res.GetSensors() {
			got = append(got, s.GetId())
		}
		if token = res.GetNextPageToken(); token == "" {
			break
		}
		// Another client's token does not fit.
		_, err = e.subs.ListClientSensors(ctx, &locksv1.ListClientSensorsRequest{ClientId: "cl_other", PageToken: token})
		wantCode(t, err, codes.InvalidArgument, "page_token")
	}
	if len(got) != 10 || got[0] != "P00001" || got[9] != "P00010" {
		t.Fatalf("client's sensors: %v", got)
	}
	sc, err := e.subs.ListSensorClients(ctx, &locksv1.ListSensorClientsRequest{SensorId: "P00001", PageSize: 1})
	if err != nil || len(sc.GetClients()) != 1 || sc.GetNextPageToken() != "" {
		t.Fatalf("sensor's clients: %v %v", sc, err)
	}
}
