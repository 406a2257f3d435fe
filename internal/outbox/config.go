package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/lock-sensors/lock-sensors/internal/backoff"
)

// Defaults of Config.
const (
	BatchDefault      = 256
	PollDefault       = time.Second
	AckTimeoutDefault = 10 * time.Second
	// BackoffMinDefault and BackoffMaxDefault bound the delay after failed rounds.
	BackoffMinDefault = 100 * time.Millisecond
	BackoffMaxDefault = 3 * time.Second
)

// Table is how the relay reads and deletes the rows of one outbox table (or of one
// partition of it). This is what a user of the component provides.
type Table struct {
	// Select reads the oldest rows in id order; its arguments are Args and then the limit
	// (so the limit is $len(Args)+1). When Shared, it must lock them: FOR UPDATE SKIP LOCKED.
	Select string
	Args   []any
	// Scan turns one row of Select into a Row.
	Scan func(pgx.Rows) (Row, error)
	// Delete removes relayed rows; $1 is their ids (bigint[]).
	Delete string
	// Shared says several relays read the table at once: reading, publishing and deleting
	// run in one transaction, whose row locks keep the others off these rows. Otherwise
	// the table has one reader (a partition's owner) and the delete runs on its own.
	Shared bool
}

// Config tunes a Relay; zero fields take the defaults.
type Config struct {
	// Name tells relays apart in logs ("attempts", "events p3").
	Name  string
	Table Table
	// Batch is the most rows one round reads (default BatchDefault).
	Batch int
	// Poll is the longest the relay idles without a Wake (default PollDefault): rows written
	// by another process are noticed that soon.
	Poll time.Duration
	// Linger lets rows gather after a wake-up, so that a round carries many (default 0).
	Linger time.Duration
	// AckTimeout bounds the wait for JetStream's acknowledgements (default AckTimeoutDefault).
	AckTimeout time.Duration
	// DrainTimeout, when positive, makes Run do one last round after ctx ends, within that
	// time, for rows written while its user was stopping.
	DrainTimeout time.Duration
	// Backoff is the delay after consecutive failed rounds (default BackoffMinDefault to
	// BackoffMaxDefault).
	Backoff backoff.Policy
	// Check, when set, sees the rows of the first round and of each round after a failure,
	// whose rows may already be in the stream (published, but the ack or the delete was
	// lost, perhaps longer ago than the stream's de-duplication window). It returns the
	// rows still to publish and the ids to delete without publishing.
	Check func(ctx context.Context, rows []Row) (publish []Row, drop []int64, err error)
	// Published, when set, is called with the rows JetStream acknowledged, before they are
	// deleted (an age metric; a test's crash point).
	Published func(rows []Row)
}

func (c *Config) setDefaults() {
	if c.Batch <= 0 {
		c.Batch = BatchDefault
	}
	if c.Poll <= 0 {
		c.Poll = PollDefault
	}
	if c.AckTimeout <= 0 {
		c.AckTimeout = AckTimeoutDefault
	}
	if c.Backoff.Min <= 0 {
		c.Backoff.Min = BackoffMinDefault
	}
	if c.Backoff.Max <= 0 {
		c.Backoff.Max = BackoffMaxDefault
	}
}

// Validate reports what the relay cannot work without.
func (c Config) Validate() error {
	switch {
	case c.Name == "":
		return errors.New("outbox: Config.Name is empty")
	case c.Table.Select == "" || c.Table.Delete == "" || c.Table.Scan == nil:
		return fmt.Errorf("outbox %s: Table needs Select, Scan and Delete", c.Name)
	case c.Linger < 0 || c.DrainTimeout < 0:
		return fmt.Errorf("outbox %s: Linger and DrainTimeout must not be negative", c.Name)
	}
	return nil
}

// Deps are what a Relay is built from. Registerer gets its metrics: a process running
// several relays wraps it with a label each (prometheus.WrapRegistererWith).
type Deps struct {
	Logger     *slog.Logger
	Registerer prometheus.Registerer
	JS         jetstream.JetStream
	PG         *pgxpool.Pool
	// Tracer, when set, gives each row with a Traceparent a publish span (trace.go); nil:
	// no tracing.
	Tracer trace.Tracer
}
