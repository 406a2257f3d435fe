// Package cluster runs the scaled topology as processes on loopback: a 3-node NATS cluster
// (nats-server from the module, with users per part) and 2 `locks run` processes of each part,
// against the databases and RabbitMQ named in Config.Env. `go tool task cluster` runs it in
// the foreground; tests start it with Start.
package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/lock-sensors/lock-sensors/internal/backoff"
	"github.com/lock-sensors/lock-sensors/internal/freeport"
)

// Defaults of Config.
const (
	NodesDefault   = 3
	PerPartDefault = 2
	SyncDefault    = "always"
	HostDefault    = "127.0.0.1"
	// PartitionsDefault splits a part's partitions between its processes with --partitions=i/k.
	PartitionsDefault = "split"
	// ReadyWithinDefault bounds the wait for every process's /readyz.
	ReadyWithinDefault = 2 * time.Minute
	// migrateWithin bounds the retries of `locks migrate` while the NATS cluster forms.
	migrateWithin = 30 * time.Second
)

// PartsDefault are the parts of `locks run --targets`.
var PartsDefault = []string{"bridge", "state", "history", "notifier", "watchdog", "api", "alerter"}

// partitioned are the parts that take --partitions.
var partitioned = []string{"state", "history", "notifier", "watchdog"}

// AdminUser is the NATS user for `locks replay`, `locks migrate` and the nats CLI.
const AdminUser = "admin"

// Config is one cluster run.
type Config struct {
	Dir      string // node configs and stores, each process's data dir; required
	LocksBin string // the locks binary; required
	NodeBin  string // deploy/cluster/natsnode built; required
	// Accounts is the nats-server file with the users (included by every node's config); it
	// reads each user's password from LOCKS_NATS_<USER>_PASSWORD. Required: see Accounts().
	Accounts string
	Nodes    int
	PerPart  int
	Parts    []string
	Host     string
	// NATSPort is the first node's client port (the next nodes count up; routes at +100,
	// monitoring at +200); 0 picks free ports. HTTPPort the same for the parts' HTTP (gRPC at +100).
	NATSPort, HTTPPort int
	// Sync is the nodes' jetstream sync_interval: "always" as the embedded server's default.
	Sync string
	// Partitions is "split" (--partitions=i/k per process) or "auto" (no --partitions, for
	// when the parts assign partitions among themselves).
	Partitions string
	// Replicas of the streams and buckets `locks migrate` declares (LOCKS_NATS_REPLICAS); 0
	// leaves the variable to Env (1 by default).
	Replicas int
	// LeaseTTL is every process's LOCKS_LEASE_TTL; 0 leaves it to Env.
	LeaseTTL    time.Duration
	Env         []string  // LOCKS_* for every locks process: databases, queue, API tokens, …
	Out         io.Writer // every process's output, one prefixed line at a time
	ReadyWithin time.Duration
}

func (c *Config) setDefaults() {
	if c.Nodes == 0 {
		c.Nodes = NodesDefault
	}
	if c.PerPart == 0 {
		c.PerPart = PerPartDefault
	}
	if len(c.Parts) == 0 {
		c.Parts = PartsDefault
	}
	if c.Host == "" {
		c.Host = HostDefault
	}
	if c.Sync == "" {
		c.Sync = SyncDefault
	}
	if c.Partitions == "" {
		c.Partitions = PartitionsDefault
	}
	if c.Out == nil {
		c.Out = os.Stderr
	}
	if c.ReadyWithin == 0 {
		c.ReadyWithin = ReadyWithinDefault
	}
}

// Validate reports the first unusable setting.
func (c Config) Validate() error {
	for name, v := range map[string]string{"Dir": c.Dir, "LocksBin": c.LocksBin, "NodeBin": c.NodeBin, "Accounts": c.Accounts} {
		if v == "" {
			return fmt.Errorf("cluster: %s is required", name)
		}
	}
	if !filepath.IsAbs(c.Dir) || !filepath.IsAbs(c.Accounts) {
		return errors.New("cluster: Dir and Accounts must be absolute paths")
	}
	if c.Nodes < 1 || c.PerPart < 1 {
		return errors.New("cluster: Nodes and PerPart must be at least 1")
	}
	for _, p := range c.Parts {
		if !slices.Contains(PartsDefault, p) {
			return fmt.Errorf("cluster: unknown part %q", p)
		}
	}
	if c.Partitions != "split" && c.Partitions != "auto" {
		return fmt.Errorf("cluster: Partitions %q: want split or auto", c.Partitions)
	}
	if c.Replicas < 0 || c.Replicas > c.Nodes || c.LeaseTTL < 0 {
		return fmt.Errorf("cluster: Replicas %d must be within 0..Nodes (%d), LeaseTTL not negative", c.Replicas, c.Nodes)
	}
	return nil
}

// env is what every locks process gets: the caller's Env, then the knobs that are set.
func (c Config) env() []string {
	env := append(os.Environ(), c.Env...)
	if c.Replicas > 0 {
		env = append(env, "LOCKS_NATS_REPLICAS="+strconv.Itoa(c.Replicas))
	}
	if c.LeaseTTL > 0 {
		env = append(env, "LOCKS_LEASE_TTL="+c.LeaseTTL.String())
	}
	return env
}

// Accounts is the accounts file of the repository at root: deploy/nats/accounts.conf, with
// the per-part users and permissions.
func Accounts(root string) string { return filepath.Join(root, "deploy", "nats", "accounts.conf") }

// Cluster is a running topology.
type Cluster struct {
	cfg       Config
	nodes     []node
	passwords map[string]string
	outMu     sync.Mutex
	portsMu   sync.Mutex
	releases  []func() // the free ports' reservations, held until Stop

	Nodes []*Process
	Parts []*Part // in start order
}

// Part is one `locks run --targets=<Name>` process.
type Part struct {
	*Process
	Part     string
	Index    int    // 0..PerPart-1
	HTTPAddr string // /readyz, /metrics and, for api, the REST gateway
	GRPCAddr string
}

// Start starts the nodes, migrates once, then starts every part's processes and returns when
// all answer /readyz. On error it stops what it started.
func Start(ctx context.Context, cfg Config) (*Cluster, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if _, err := os.Stat(cfg.Accounts); err != nil {
		return nil, fmt.Errorf("cluster: the NATS accounts file: %w", err)
	}
	c := &Cluster{cfg: cfg}
	if err := c.start(ctx); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

func (c *Cluster) start(ctx context.Context) error {
	users := append(slices.Clone(PartsDefault), AdminUser)
	pw, err := passwords(users)
	if err != nil {
		return err
	}
	c.passwords = pw
	for i := range c.cfg.Nodes {
		n := node{name: "nats-" + strconv.Itoa(i+1)}
		if n.client, err = c.addr(c.cfg.NATSPort, i); err != nil {
			return err
		}
		if n.route, err = c.addr(c.cfg.NATSPort, 100+i); err != nil {
			return err
		}
		if n.monitor, err = c.addr(c.cfg.NATSPort, 200+i); err != nil {
			return err
		}
		c.nodes = append(c.nodes, n)
	}
	if err := c.startNodes(ctx); err != nil {
		return err
	}
	// Migrations once, before any part: the parts' own start-up migration then finds nothing to do.
	// As admin, it also declares the NATS streams and buckets, which the parts' users may not.
	// A node answers /healthz before the meta leader counts it as a peer, so an R3 stream may
	// find "no suitable peers" for a moment: migrate again until migrateWithin.
	retry := backoff.New(250*time.Millisecond, 2*time.Second)
	for deadline := time.Now().Add(migrateWithin); ; {
		mig := exec.CommandContext(ctx, c.cfg.LocksBin, "migrate")
		mig.Env = append(c.cfg.env(), "LOCKS_NATS_URL="+natsURL(c.nodes, AdminUser, c.passwords[AdminUser]))
		out, err := mig.CombinedOutput()
		if err == nil {
			break
		}
		if !bytes.Contains(out, []byte("no suitable peers")) || time.Now().After(deadline) {
			return fmt.Errorf("locks migrate: %w: %s", err, out)
		}
		if !retry.Wait(ctx) {
			return ctx.Err()
		}
	}
	k := 0
	for _, name := range c.cfg.Parts {
		for i := range c.cfg.PerPart {
			p := &Part{Part: name, Index: i}
			if p.HTTPAddr, err = c.addr(c.cfg.HTTPPort, k); err != nil {
				return err
			}
			if p.GRPCAddr, err = c.addr(c.cfg.HTTPPort, 100+k); err != nil {
				return err
			}
			k++
			c.Parts = append(c.Parts, p)
		}
	}
	// The first process declares the streams alone, so that the others find them made.
	if err := c.startPart(ctx, c.Parts[0]); err != nil {
		return err
	}
	g, gctx := errgroup.WithContext(ctx)
	for _, p := range c.Parts[1:] {
		g.Go(func() error { return c.startPart(gctx, p) })
	}
	return g.Wait()
}

// addr is host:base+offset, or a free port when base is 0.
func (c *Cluster) addr(base, offset int) (string, error) {
	if base != 0 {
		return net.JoinHostPort(c.cfg.Host, strconv.Itoa(base+offset)), nil
	}
	addr, release, err := freeport.Reserve(c.cfg.Host)
	if err != nil {
		return "", err
	}
	c.portsMu.Lock()
	c.releases = append(c.releases, release)
	c.portsMu.Unlock()
	return addr, nil
}

// startPart starts p and waits for its /readyz. With free ports (HTTPPort 0), a process that
// exits at start is started again on new ones, twice at most: a port found free can be taken
// by another process before the part listens on it ("address already in use").
func (c *Cluster) startPart(ctx context.Context, p *Part) error {
	for try := 1; ; try++ {
		err := c.startPartOnce(ctx, p)
		if err == nil || c.cfg.HTTPPort != 0 || try == 3 || !errors.Is(err, errExitedEarly) {
			return err
		}
		if p.HTTPAddr, err = c.addr(0, 0); err != nil {
			return err
		}
		if p.GRPCAddr, err = c.addr(0, 0); err != nil {
			return err
		}
	}
}

func (c *Cluster) startPartOnce(ctx context.Context, p *Part) error {
	name := p.Part + "-" + strconv.Itoa(p.Index+1)
	args := []string{"run", "--targets=" + p.Part}
	if c.cfg.Partitions == "split" && slices.Contains(partitioned, p.Part) {
		args = append(args, fmt.Sprintf("--partitions=%d/%d", p.Index, c.cfg.PerPart))
	}
	cmd := exec.Command(c.cfg.LocksBin, args...)
	cmd.Env = append(c.cfg.env(),
		"LOCKS_NATS_URL="+natsURL(c.nodes, p.Part, c.passwords[p.Part]),
		"LOCKS_NATS_DECLARE=false",
		"LOCKS_HTTP_ADDR="+p.HTTPAddr,
		"LOCKS_GRPC_ADDR="+p.GRPCAddr,
		"LOCKS_DATA_DIR="+filepath.Join(c.cfg.Dir, name),
		"PGAPPNAME="+name, // its Postgres sessions carry its name
	)
	proc, err := start(name, cmd, c.cfg.Out, &c.outMu)
	if err != nil {
		return err
	}
	p.Process = proc
	return waitHTTP(ctx, proc, "http://"+p.HTTPAddr+"/readyz", c.cfg.ReadyWithin)
}

// NATSURL is LOCKS_NATS_URL for user (a part's name or AdminUser): every node, with its password.
func (c *Cluster) NATSURL(user string) string { return natsURL(c.nodes, user, c.passwords[user]) }

// Of is the processes of one part.
func (c *Cluster) Of(part string) []*Part {
	var ps []*Part
	for _, p := range c.Parts {
		if p.Part == part {
			ps = append(ps, p)
		}
	}
	return ps
}

// Wait returns when a process exits by itself (an error naming it) or ctx is done (nil).
func (c *Cluster) Wait(ctx context.Context) error {
	all := slices.Clone(c.Nodes)
	for _, p := range c.Parts {
		all = append(all, p.Process)
	}
	exited := make(chan *Process, len(all))
	for _, p := range all {
		go func() {
			select {
			case <-p.Done():
				exited <- p
			case <-ctx.Done():
			}
		}()
	}
	select {
	case p := <-exited:
		return fmt.Errorf("%s exited: %v", p.Name, p.Err())
	case <-ctx.Done():
		return nil
	}
}

// Stop stops the parts (all at once, each with its grace), then the nodes.
func (c *Cluster) Stop() {
	var wg sync.WaitGroup
	for _, p := range c.Parts {
		if p.Process != nil {
			wg.Go(p.Stop)
		}
	}
	wg.Wait()
	for _, n := range c.Nodes {
		wg.Go(n.Stop)
	}
	wg.Wait()
	c.portsMu.Lock()
	defer c.portsMu.Unlock()
	for _, release := range c.releases {
		release()
	}
	c.releases = nil
}
