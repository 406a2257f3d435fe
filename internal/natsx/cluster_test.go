package natsx_test

import (
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// jsCluster starts n JetStream servers routed to each other on loopback, as nats-server's
// own createJetStreamClusterExplicit does, and returns a client connected to all of them
// once the meta group has a leader that knows every peer.
func jsCluster(t *testing.T, n int) jetstream.JetStream {
	t.Helper()
	ports := make([]int, n)
	routes := make([]*url.URL, n)
	for i := range n {
		// The route ports must be known before any server starts: reserve free ones.
		_, p, _ := net.SplitHostPort(testenv.FreeAddr(t))
		ports[i], _ = strconv.Atoi(p)
		routes[i] = &url.URL{Scheme: "nats-route", Host: fmt.Sprintf("127.0.0.1:%d", ports[i])}
	}
	servers := make([]*server.Server, n)
	urls := make([]string, n)
	for i := range n {
		ns, err := server.NewServer(&server.Options{
			ServerName: fmt.Sprintf("n%d", i+1),
			Host:       "127.0.0.1", Port: -1,
			JetStream: true, StoreDir: t.TempDir(),
			// The server would otherwise take three quarters of the disk's free space as its
			// limit, and refuse a replica of a stream whose limits (MaxBytes) do not fit it
			// when the machine's disk is fuller than usual: the tests write kilobytes.
			JetStreamMaxStore: 1 << 40,
			Cluster:           server.ClusterOpts{Name: "locks", Host: "127.0.0.1", Port: ports[i]},
			Routes:            routes,
			NoSigs:            true, NoLog: true,
		})
		if err != nil {
			t.Fatalf("NATS node %d: %v", i+1, err)
		}
		go ns.Start()
		t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
		if !ns.ReadyForConnections(10 * time.Second) {
			t.Fatalf("NATS node %d not ready within 10s", i+1)
		}
		servers[i], urls[i] = ns, ns.ClientURL()
	}
	deadline := time.Now().Add(30 * time.Second)
	for !clusterReady(servers, n) {
		if time.Now().After(deadline) {
			t.Fatalf("NATS cluster of %d did not elect a JetStream leader knowing every peer within 30s", n)
		}
		time.Sleep(50 * time.Millisecond)
	}
	nc, err := nats.Connect(strings.Join(urls, ","), nats.MaxReconnects(-1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	// The JetStream API's requests get the 30 s that `locks` gives Declare at start, not the
	// client's 5 s: a stream's creation waits for the meta leader and the placed node, which
	// may be slow to answer on a busy machine.
	js, err := jetstream.New(nc, jetstream.WithDefaultTimeout(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	return js
}

func clusterReady(servers []*server.Server, n int) bool {
	leader := false
	for _, s := range servers {
		if !s.JetStreamIsCurrent() {
			return false
		}
		if s.JetStreamIsLeader() {
			leader = len(s.JetStreamClusterPeers()) == n
		}
	}
	return leader
}
