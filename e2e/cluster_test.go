package e2e_test

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// cluster is the system as separate processes: a NATS server of its own (nats-server built
// from the module in go.mod) and one `locks run --targets=<part>` process per part, on
// private databases and queues, so that each process's CPU can be read from /proc.
type cluster struct {
	tb         testing.TB
	partitions int
	env        []string
	pgURL      string
	token      string
	rabbit     *testenv.RabbitEnv
	nats       *exec.Cmd
	parts      []*part
}

// part is one `locks run` process.
type part struct {
	name string
	cmd  *exec.Cmd
	http string
	log  *syncBuffer
}

func (p *part) metricsURL() string { return "http://" + p.http + "/metrics" }

var (
	natsBinOnce sync.Once
	natsBin     string
	natsBinErr  error
)

// natsServerBin builds nats-server once, into binDir.
func natsServerBin(tb testing.TB) string {
	natsBinOnce.Do(func() {
		natsBin = filepath.Join(binDir, "nats-server")
		out, err := exec.Command("go", "build", "-o", natsBin, "github.com/nats-io/nats-server/v2").CombinedOutput()
		if err != nil {
			natsBinErr = fmt.Errorf("go build nats-server: %v: %s", err, out)
		}
	})
	if natsBinErr != nil {
		tb.Fatal(natsBinErr)
	}
	return natsBin
}

// newCluster starts NATS and prepares the databases and queues; parts are added with part.
func newCluster(tb testing.TB, partitions int) *cluster {
	tb.Helper()
	c := &cluster{tb: tb, partitions: partitions, pgURL: testenv.PostgresURL(tb), token: "e2e-token-0123456789", rabbit: testenv.RabbitMQ(tb)}
	chDB := testenv.Name("locks_e2e")
	tb.Cleanup(func() { testenv.DropClickHouseDatabase(tb, chDB) })

	natsAddr := testenv.FreeAddr(tb)
	dir := tb.TempDir()
	conf := filepath.Join(dir, "nats.conf")
	// As natsx.Embedded configures the embedded server: JetStream on a file store, 1 MiB payloads.
	if err := os.WriteFile(conf, fmt.Appendf(nil, "listen: %q\nmax_payload: 1048576\njetstream { store_dir: %q }\n",
		natsAddr, filepath.Join(dir, "jetstream")), 0o644); err != nil {
		tb.Fatal(err)
	}
	c.nats = exec.Command(natsServerBin(tb), "-c", conf)
	natsLog := &syncBuffer{}
	c.nats.Stdout, c.nats.Stderr = natsLog, natsLog
	if err := c.nats.Start(); err != nil {
		tb.Fatal(err)
	}
	stopProcess(tb, "nats-server", c.nats, natsLog)
	testenv.Eventually(tb, 30*time.Second, "nats-server to listen", func() bool {
		conn, err := net.Dial("tcp", natsAddr)
		if err == nil {
			conn.Close()
		}
		return err == nil
	})
	c.env = append(os.Environ(),
		"LOCKS_POSTGRES_URL="+c.pgURL,
		"LOCKS_CLICKHOUSE_URL=clickhouse://"+testenv.ClickHouseAddr()+"/"+chDB,
		"LOCKS_AMQP_URL="+c.rabbit.URL,
		"LOCKS_AMQP_QUEUE="+c.rabbit.Queue,
		"LOCKS_NATS_URL=nats://"+natsAddr,
		"LOCKS_API_TOKENS="+c.token,
		"LOCKS_PARTITIONS="+strconv.Itoa(partitions),
		"LOCKS_WEBHOOK_ALLOW_PRIVATE=true",
		"LOCKS_LOG_LEVEL=info",
	)
	return c
}

// stopProcess stops cmd with SIGTERM at cleanup (killing it after 20 s) and shows its log
// if the benchmark failed.
func stopProcess(tb testing.TB, name string, cmd *exec.Cmd, log *syncBuffer) (exited <-chan struct{}) {
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	tb.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if tb.Failed() {
			tb.Logf("%s log:\n%s", name, log.String())
		}
		if dir := os.Getenv("LOCKS_BENCH_LOGS"); dir != "" {
			_ = os.MkdirAll(dir, 0o755)
			_ = os.WriteFile(filepath.Join(dir, strings.NewReplacer(" ", "-", "/", "of").Replace(name)+".log"), []byte(log.String()), 0o644)
		}
	})
	return done
}

// part starts `locks run --targets=<targets> --partitions=<partitions>` and waits until ready.
// Parts are started one after another, so that migrations never run concurrently.
func (c *cluster) part(targets, partitions string, env ...string) *part {
	tb := c.tb
	tb.Helper()
	p := &part{name: targets, http: testenv.FreeAddr(tb), log: &syncBuffer{}}
	args := []string{"run", "--targets=" + targets}
	if partitions != "" {
		args = append(args, "--partitions="+partitions)
		p.name += " " + partitions
	}
	p.cmd = exec.Command(locksBin, args...)
	p.cmd.Env = append(append(c.env, "LOCKS_HTTP_ADDR="+p.http, "LOCKS_GRPC_ADDR="+testenv.FreeAddr(tb),
		"LOCKS_DATA_DIR="+tb.TempDir()), env...)
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	if err := p.cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	exited := stopProcess(tb, "locks "+p.name, p.cmd, p.log)
	waitReady(tb, "locks "+p.name, p.http, exited, p.log, 60*time.Second)
	c.parts = append(c.parts, p)
	return p
}

// components are the cluster's processes, the servers and this process (the load
// generator, its webhook receiver and the samplers).
func (c *cluster) components() []testenv.Component {
	cs := []testenv.Component{}
	for _, p := range c.parts {
		cs = append(cs, testenv.Component{Name: "locks-" + strings.ReplaceAll(p.name, " ", "-"), CPU: testenv.PidCPU(p.cmd.Process.Pid)})
	}
	cs = append(cs, testenv.Component{Name: "nats-server", CPU: testenv.PidCPU(c.nats.Process.Pid)})
	return append(cs, testenv.Servers()...)
}

// benchOut is where benchmarks write their time series for benchreport (LOCKS_BENCH_OUT,
// default bench-out/ at the top of the module).
func benchOut(tb testing.TB) string {
	dir := os.Getenv("LOCKS_BENCH_OUT")
	if dir == "" {
		dir = filepath.Join("..", "bench-out")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	return dir
}
