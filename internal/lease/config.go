package lease

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/lock-sensors/lock-sensors/internal/clock"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/partition"
)

// Defaults of Config.
const (
	// TTLDefault is how long a lease lives without renewal: a dead process's partitions are
	// free after at most this, and taken within one Renew more (under 10 s).
	TTLDefault = natsx.LeaseTTLDefault
	// RenewDivisor: leases are renewed every TTL/RenewDivisor, so two renewals can fail
	// before a lease lapses.
	RenewDivisor = 3
)

// Config configures the partition assignment of one part.
type Config struct {
	// Name is the part (state, notifier, watchdog): the bucket is leases_<Name> and the
	// fence rows are partition_owners (Name, partition).
	Name string
	// PartitionCount is the number of partitions to share.
	PartitionCount int
	// Partitions, when set, are taken as they are (the --partitions override): no lease,
	// but each is still claimed in the fence, so a previous owner writes nothing more.
	Partitions partition.Set
	// Owner names this process in the bucket and the fence; unique per process.
	Owner string
	// TTL is the lease's life without renewal.
	TTL time.Duration
	// Renew is the period of renewal and rebalancing (TTL/RenewDivisor by default).
	Renew time.Duration
}

var ownerRe = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)

// NewOwner returns a process's owner id: host, pid and a random part, so a restarted
// process is a new owner.
func NewOwner() string {
	host, _ := os.Hostname()
	host = regexp.MustCompile(`[^A-Za-z0-9_-]`).ReplaceAllString(host, "-")
	if len(host) > 64 {
		host = host[:64]
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	return host + "-" + strconv.Itoa(os.Getpid()) + "-" + hex.EncodeToString(b[:])
}

func (c *Config) setDefaults() {
	if c.TTL == 0 {
		c.TTL = TTLDefault
	}
	if c.Renew == 0 {
		c.Renew = c.TTL / RenewDivisor
	}
	if c.Owner == "" {
		c.Owner = NewOwner()
	}
}

// Validate reports the first bad field.
func (c Config) Validate() error {
	switch {
	case !regexp.MustCompile(`^[a-z0-9_]+$`).MatchString(c.Name):
		return fmt.Errorf("lease: name %q: want lower-case letters, digits, _", c.Name)
	case c.PartitionCount < 1:
		return fmt.Errorf("lease %s: partition count %d < 1", c.Name, c.PartitionCount)
	case !ownerRe.MatchString(c.Owner):
		return fmt.Errorf("lease %s: owner %q: want 1 to 128 letters, digits, _ or -", c.Name, c.Owner)
	case c.TTL < time.Second:
		return fmt.Errorf("lease %s: ttl %s < 1s", c.Name, c.TTL)
	case c.Renew <= 0 || c.Renew > c.TTL/2:
		return fmt.Errorf("lease %s: renew period %s not in (0, ttl/2]", c.Name, c.Renew)
	}
	if err := c.Partitions.Check(c.PartitionCount); err != nil {
		return fmt.Errorf("lease %s: %w", c.Name, err)
	}
	return nil
}

// Deps are what the assignment runs on: the bucket in JS, the fence in PG.
type Deps struct {
	Logger     *slog.Logger
	Registerer prometheus.Registerer
	JS         jetstream.JetStream
	PG         *pgxpool.Pool
	// Clock times the renewals and Valid (nil: the system clock).
	Clock clock.Clock
}
