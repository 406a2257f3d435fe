// Command up runs the local scaled topology (deploy/cluster) in the foreground until Ctrl-C:
// go tool task cluster. Databases and RabbitMQ come from LOCKS_* as for `locks run`.
package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/lock-sensors/lock-sensors/deploy/cluster"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "[cluster]", err)
		os.Exit(1)
	}
}

func run() error {
	dir := flag.String("dir", "./.locks-cluster", "node stores, configs and each process's data dir (kept across runs)")
	locks := flag.String("locks", "./bin/locks", "the locks binary")
	node := flag.String("natsnode", "./bin/natsnode", "the natsnode binary (go build ./deploy/cluster/natsnode)")
	natsPort := flag.Int("nats-port", 4222, "first NATS client port (routes at +100, monitoring at +200)")
	httpPort := flag.Int("http-port", 8080, "first part's HTTP port, one per process (gRPC at +100)")
	flag.Parse()

	abs := func(p string) string { a, _ := filepath.Abs(p); return a }
	root, _ := os.Getwd()
	d := abs(*dir)
	if err := os.MkdirAll(d, 0o700); err != nil {
		return err
	}
	token, err := apiToken(d)
	if err != nil {
		return err
	}
	cfg := cluster.Config{Dir: d, LocksBin: abs(*locks), NodeBin: abs(*node), Accounts: cluster.Accounts(root),
		NATSPort: *natsPort, HTTPPort: *httpPort, Env: []string{"LOCKS_API_TOKENS=" + token}}
	if !strings.HasSuffix(cfg.Accounts, filepath.Join("nats", "accounts.conf")) {
		fmt.Fprintf(os.Stderr, "[cluster] NATS users from the PLACEHOLDER %s (full permissions) until deploy/nats/accounts.conf exists\n", cfg.Accounts)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	c, err := cluster.Start(ctx, cfg)
	if err != nil {
		return err
	}
	defer c.Stop()
	fmt.Fprintf(os.Stderr, "[cluster] ready: %d NATS nodes, %d locks processes\n", len(c.Nodes), len(c.Parts))
	for _, p := range c.Parts {
		fmt.Fprintf(os.Stderr, "[cluster]   %-10s #%d pid %-7d http://%s\n", p.Part, p.Index+1, p.Cmd.Process.Pid, p.HTTPAddr)
	}
	fmt.Fprintf(os.Stderr, "[cluster] admin NATS URL (locks replay, nats CLI): %s\n", c.NATSURL(cluster.AdminUser))
	fmt.Fprintf(os.Stderr, "[cluster] API token: %s (REST on the api processes above); Ctrl-C stops everything\n", token)
	err = c.Wait(ctx)
	fmt.Fprintln(os.Stderr, "[cluster] stopping…")
	return err
}

// apiToken is LOCKS_API_TOKENS, or one made once and kept in dir, as deploy/local/up.sh does.
func apiToken(dir string) (string, error) {
	if t := os.Getenv("LOCKS_API_TOKENS"); t != "" {
		return t, nil
	}
	f := filepath.Join(dir, "api-token")
	if b, err := os.ReadFile(f); err == nil && len(b) > 0 {
		return strings.TrimSpace(string(b)), nil
	}
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	t := base64.RawURLEncoding.EncodeToString(b)
	return t, os.WriteFile(f, []byte(t+"\n"), 0o600)
}
