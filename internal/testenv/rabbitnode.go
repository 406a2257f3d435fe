package testenv

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// RabbitNode is a private RabbitMQ node (own name, ports, data and log dirs, no plugins),
// so a test may kill and restart it without touching the shared server.
type RabbitNode struct {
	t    testing.TB
	dir  string
	name string
	port int
	dist int
	cmd  *exec.Cmd
	URL  string
}

// freePort is the port of FreeAddr.
func freePort(t testing.TB) int {
	_, p, _ := net.SplitHostPort(FreeAddr(t))
	n, _ := strconv.Atoi(p)
	return n
}

const rabbitServer = "/usr/lib/rabbitmq/bin/rabbitmq-server"

// PrivateRabbitMQ starts a RabbitMQ node of t's own, killed and removed at the end of the test.
func PrivateRabbitMQ(t testing.TB) *RabbitNode {
	t.Helper()
	if _, err := os.Stat(rabbitServer); err != nil {
		t.Fatalf("%s not found (%v): install the rabbitmq-server Debian package (`go tool task test` does)", rabbitServer, err)
	}
	dir, err := os.MkdirTemp("", "locks-test-rabbit-")
	if err != nil {
		t.Fatal(err)
	}
	n := &RabbitNode{t: t, dir: dir, port: freePort(t), dist: freePort(t)}
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
	t.Cleanup(func() {
		n.Kill()
		_ = os.RemoveAll(dir)
	})
	n.Start()
	return n
}

// Start starts the node on its data and waits until it takes connections.
func (n *RabbitNode) Start() {
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
	out, err := os.Create(filepath.Join(n.dir, "server.out"))
	if err != nil {
		n.t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		n.t.Fatalf("start private RabbitMQ: %v", err)
	}
	n.cmd = cmd
	deadline := time.Now().Add(90 * time.Second)
	for {
		c, err := amqp.Dial(n.URL)
		if err == nil {
			_ = c.Close()
			return
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(filepath.Join(n.dir, "server.out"))
			n.t.Fatalf("private RabbitMQ node %s not ready within 90s: %v\n%s", n.name, err, b)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Kill stops the node as a crash would (SIGKILL to its whole process group).
func (n *RabbitNode) Kill() {
	if n.cmd == nil {
		return
	}
	_ = syscall.Kill(-n.cmd.Process.Pid, syscall.SIGKILL)
	_ = n.cmd.Wait()
	n.cmd = nil
}

// Restart kills the node and starts it again on the same data.
func (n *RabbitNode) Restart() {
	n.t.Helper()
	n.Kill()
	n.Start()
}
