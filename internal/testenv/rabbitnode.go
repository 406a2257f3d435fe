package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// RabbitNode is a private RabbitMQ node (own name, ports, data and log dirs, no plugins),
// so a test may kill and restart it without touching the shared server.
type RabbitNode struct {
	privateServer
	name string
	port int
	dist int
	URL  string
}

const rabbitServer = "/usr/lib/rabbitmq/bin/rabbitmq-server"

// PrivateRabbitMQ starts a RabbitMQ node of t's own, killed and removed at the end of the test.
func PrivateRabbitMQ(t testing.TB) *RabbitNode {
	t.Helper()
	return BootPrivateRabbitMQ(t)()
}

// BootPrivateRabbitMQ is PrivateRabbitMQ in two steps: it starts the node and returns at
// once, and ready waits until the node takes connections. A parallel test calls it before
// t.Parallel, so that the node boots (seconds of Erlang) while the test waits for its slot.
func BootPrivateRabbitMQ(t testing.TB) (ready func() *RabbitNode) {
	t.Helper()
	needBinary(t, rabbitServer, "rabbitmq-server")
	dir := privateDir(t, "locks-test-rabbit-")
	n := &RabbitNode{privateServer: privateServer{t: t, dir: dir}, port: freePort(t), dist: freePort(t)}
	n.name = "lockstest" + strconv.Itoa(n.port) + "@localhost"
	n.URL = fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/", n.port)
	for _, d := range []string{"home", "mnesia", "log"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	conf := fmt.Sprintf("listeners.tcp.default = 127.0.0.1:%d\nloopback_users = none\n", n.port)
	if err := os.WriteFile(filepath.Join(dir, "rabbitmq.conf"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "enabled_plugins"), []byte("[].\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	n.start = n.Start
	t.Cleanup(func() {
		n.Kill()
		_ = os.RemoveAll(dir)
	})
	wait := n.boot()
	return func() *RabbitNode {
		t.Helper()
		wait()
		return n
	}
}

// Start starts the node on its data and waits until it takes connections.
func (n *RabbitNode) Start() {
	n.t.Helper()
	n.boot()()
}

// boot starts the node on its data; wait waits until it takes connections.
func (n *RabbitNode) boot() (wait func()) {
	n.t.Helper()
	cmd := exec.Command(rabbitServer)
	cmd.Env = append(os.Environ(),
		"HOME="+filepath.Join(n.dir, "home"),
		"RABBITMQ_NODENAME="+n.name,
		"RABBITMQ_NODE_PORT="+strconv.Itoa(n.port),
		"RABBITMQ_DIST_PORT="+strconv.Itoa(n.dist),
		"RABBITMQ_MNESIA_BASE="+filepath.Join(n.dir, "mnesia"),
		"RABBITMQ_LOG_BASE="+filepath.Join(n.dir, "log"),
		"RABBITMQ_CONFIG_FILE="+filepath.Join(n.dir, "rabbitmq.conf"),
		"RABBITMQ_ENABLED_PLUGINS_FILE="+filepath.Join(n.dir, "enabled_plugins"),
		"RABBITMQ_PID_FILE="+filepath.Join(n.dir, "pid"),
	)
	n.proc, wait = spawnPrivate(n.t, "private RabbitMQ node "+n.name, n.dir, cmd, 90*time.Second, func() error {
		c, err := amqp.Dial(n.URL)
		if err == nil {
			_ = c.Close()
		}
		return err
	})
	return wait
}

// BareConsumer declares queue on conn (durable) and consumes it on a channel of its own with a
// prefetch of 1,000, acking each message: RabbitMQ's pass-through with nothing of ours in the
// way. After n messages it sends nil on the returned channel (or the error that stopped it).
func BareConsumer(tb testing.TB, conn *amqp.Connection, queue string, n int) <-chan error {
	tb.Helper()
	sub, err := conn.Channel()
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := sub.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		tb.Fatal(err)
	}
	if err := sub.Qos(1000, 0, false); err != nil {
		tb.Fatal(err)
	}
	ds, err := sub.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		tb.Fatal(err)
	}
	consumed := make(chan error, 1)
	go func() {
		for range n {
			d, ok := <-ds
			if !ok {
				consumed <- fmt.Errorf("delivery channel closed")
				return
			}
			if err := d.Ack(false); err != nil {
				consumed <- err
				return
			}
		}
		consumed <- nil
	}()
	return consumed
}
