package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
)

const clickhouseServer = "/usr/sbin/clickhouse-server"

// clickhouseConfig is a minimal config.xml for Debian's 18.16: its own ports on loopback,
// its own data, tmp and log paths, and the users file beside it. No interserver port: a
// single node needs none.
const clickhouseConfig = `<?xml version="1.0"?>
<yandex>
    <logger><level>information</level><log>{dir}/log/server.log</log><errorlog>{dir}/log/error.log</errorlog></logger>
    <listen_host>127.0.0.1</listen_host>
    <tcp_port>{tcp}</tcp_port>
    <http_port>{http}</http_port>
    <path>{dir}/data/</path>
    <tmp_path>{dir}/tmp/</tmp_path>
    <user_files_path>{dir}/user_files/</user_files_path>
    <format_schema_path>{dir}/format_schemas/</format_schema_path>
    <users_config>{dir}/users.xml</users_config>
    <default_profile>default</default_profile>
    <default_database>default</default_database>
    <max_concurrent_queries>100</max_concurrent_queries>
    <mark_cache_size>268435456</mark_cache_size>
</yandex>
`

const clickhouseUsers = `<?xml version="1.0"?>
<yandex>
    <profiles><default><max_memory_usage>2000000000</max_memory_usage></default></profiles>
    <users>
        <default>
            <password></password>
            <networks><ip>127.0.0.1</ip><ip>::1</ip></networks>
            <profile>default</profile>
            <quota>default</quota>
        </default>
    </users>
    <quotas><default><interval><duration>3600</duration><queries>0</queries><errors>0</errors><result_rows>0</result_rows><read_rows>0</read_rows><execution_time>0</execution_time></interval></default></quotas>
</yandex>
`

// ClickHouseNode is a private clickhouse-server (own ports, data and config), so a test may
// kill and restart it without touching the shared server.
type ClickHouseNode struct {
	privateServer
	// Addr is its native-protocol address.
	Addr string
}

// PrivateClickHouse starts a ClickHouse server of t's own, killed and removed at the end of
// the test.
func PrivateClickHouse(t testing.TB) *ClickHouseNode {
	t.Helper()
	needBinary(t, clickhouseServer, "clickhouse-server")
	n := &ClickHouseNode{privateServer: privateServer{t: t, dir: privateDir(t, "locks-test-ch-")}}
	n.start = n.Start
	t.Cleanup(func() {
		n.Kill()
		_ = os.RemoveAll(n.dir)
	})
	tcp := freePort(t)
	n.Addr = fmt.Sprintf("127.0.0.1:%d", tcp)
	conf := clickhouseConfig
	for k, v := range map[string]string{"{dir}": n.dir, "{tcp}": fmt.Sprint(tcp), "{http}": fmt.Sprint(freePort(t))} {
		conf = strings.ReplaceAll(conf, k, v)
	}
	for _, d := range []string{"log", "data", "tmp", "user_files", "format_schemas"} {
		if err := os.MkdirAll(filepath.Join(n.dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for name, body := range map[string]string{"config.xml": conf, "users.xml": clickhouseUsers} {
		if err := os.WriteFile(filepath.Join(n.dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	n.Start()
	return n
}

// Start starts the server on its data and waits until it answers a ping.
func (n *ClickHouseNode) Start() {
	n.t.Helper()
	cmd := exec.Command(clickhouseServer, "--config-file="+filepath.Join(n.dir, "config.xml"))
	cmd.Dir = n.dir
	n.proc = startPrivate(n.t, "private ClickHouse at "+n.Addr, n.dir, cmd, time.Minute, func() error {
		c, err := clickhouse.Open(&clickhouse.Options{Addr: []string{n.Addr}, DialTimeout: 2 * time.Second})
		if err != nil {
			return err
		}
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		return c.Ping(ctx)
	})
}
