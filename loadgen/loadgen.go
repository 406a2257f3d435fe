// Package loadgen simulates a fleet of door-lock sensors publishing readings to RabbitMQ
// at a fixed rate, the way real sensors would (persistent messages with a message_id, under
// publisher confirms), and keeps the books a run is checked against: how many readings were
// published, how many were deliberately invalid, and how many state changes each sensor made.
package loadgen

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/lock-sensors/lock-sensors/internal/redact"
)

// Config is one load run.
type Config struct {
	AMQPURL string
	Queue   string
	// Sensors in the fleet; readings go round-robin over the sensors that are not silent.
	Sensors int
	// Rate is readings per second over the whole fleet.
	Rate float64
	// ChangeRatio is the chance that a reading differs from the sensor's previous one.
	ChangeRatio float64
	// SilentRatio of the sensors send one reading at the start and then nothing.
	SilentRatio float64
	// InvalidRatio of the messages are invalid (they must end in the invalid queue).
	InvalidRatio float64
	Duration     time.Duration
	// Count, when > 0, stops after that many messages instead of after Duration.
	Count int64
	// Prefix names the sensors: <Prefix><n>. Letters and digits only.
	Prefix string
	Seed   uint64
	// Live, if not nil, gets the run's counts as it goes, for a progress line or a time series.
	Live *Live
	// Last, if not nil, is each sensor's last data from an earlier run of the same fleet (its
	// Books.Last), so that the books continue it: a sensor's first reading in this run is a
	// change only if it differs. The earlier run must have used another Seed (message ids).
	Last map[string]uint8
}

// Live are the counts of a run in progress, read while it goes on.
type Live struct {
	Published atomic.Int64 // confirmed by RabbitMQ
	Invalid   atomic.Int64 // sent invalid (counted when sent)
	Changes   atomic.Int64 // state changes the sent readings make (counted when sent)
}

// Validate says what is wrong with c, naming the flag.
func (c *Config) Validate() error {
	switch {
	case c.Sensors < 1:
		return errors.New("--sensors must be at least 1")
	case c.Rate <= 0:
		return errors.New("--rate must be positive")
	case c.ChangeRatio < 0 || c.ChangeRatio > 1:
		return errors.New("--change-ratio must be within 0..1")
	case c.SilentRatio < 0 || c.SilentRatio >= 1:
		return errors.New("--silent-ratio must be within 0..1 (exclusive of 1)")
	case c.InvalidRatio < 0 || c.InvalidRatio >= 1:
		return errors.New("--invalid-ratio must be within 0..1 (exclusive of 1)")
	case c.Duration <= 0 && c.Count <= 0:
		return errors.New("--duration must be positive")
	case len(c.Prefix)+len(strconv.Itoa(c.Sensors)) > 16:
		return errors.New("--prefix is too long: sensor ids have at most 16 characters")
	}
	return nil
}

// Books are what a run published, to be balanced against what the system recorded.
type Books struct {
	Published int64 // every message confirmed by RabbitMQ, valid or not
	Invalid   int64 // of which deliberately invalid
	// Changes is the number of state_changed events the system must emit: each sensor's
	// first reading plus every reading that differs from the previous one.
	Changes int64
	// Last is each sensor's last published data; Silent lists the sensors that went silent.
	Last map[string]uint8
	// LastAt is when this run last published a reading of each sensor: a connection_lost
	// earlier than LastAt + lost_after is a false alarm, a later one the fleet stopping.
	LastAt map[string]time.Time
	// ChangesOf is each sensor's share of Changes: the state_changed events every client
	// subscribed to it must get, revisions 1 to ChangesOf (in a fleet's first run).
	ChangesOf map[string]int64
	Silent    []string
	// Start and End bound the publishing.
	Start, End time.Time
}

// SensorID is the id of sensor n of the fleet.
func SensorID(prefix string, n int) string { return prefix + strconv.Itoa(n) }

// Run publishes until the duration (or count) is reached or ctx is done. Progress, if not nil,
// gets a line a second.
func Run(ctx context.Context, c Config, progress io.Writer, log *slog.Logger) (Books, error) {
	if c.Prefix == "" {
		c.Prefix = "lg"
	}
	if err := c.Validate(); err != nil {
		return Books{}, err
	}
	conn, err := amqp.DialConfig(c.AMQPURL, amqp.Config{Properties: amqp.Table{"connection_name": "locks-loadgen"}})
	if err != nil {
		return Books{}, fmt.Errorf("loadgen: RabbitMQ %s: %w", redact.URL(c.AMQPURL), err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return Books{}, err
	}
	if _, err := ch.QueueDeclare(c.Queue, true, false, false, false, nil); err != nil {
		return Books{}, fmt.Errorf("loadgen: declare %s: %w", c.Queue, err)
	}
	if err := ch.Confirm(false); err != nil {
		return Books{}, err
	}
	g := newGenerator(c, ch)
	stopProgress := make(chan struct{})
	defer close(stopProgress)
	if progress != nil {
		go g.showProgress(progress, stopProgress)
	}

	interval := time.Duration(float64(time.Second) / c.Rate)
	next := time.Now()
	var i int64
	deadline := g.b.Start.Add(c.Duration)
	for {
		if c.Count > 0 && i >= c.Count || c.Count <= 0 && !time.Now().Before(deadline) {
			break
		}
		if err := ctx.Err(); err != nil {
			break
		}
		if d := time.Until(next); d > 0 {
			if len(g.pending) > 0 && d > time.Millisecond {
				if err := g.flush(ctx); err != nil {
					return g.books(), err
				}
			}
			time.Sleep(time.Until(next))
		}
		next = next.Add(interval)
		if err := g.publish(ctx, i); err != nil {
			return g.books(), err
		}
		i++
	}
	if err := g.flush(ctx); err != nil {
		return g.books(), err
	}
	b := g.books()
	b.Published = g.live.Published.Load() - g.base
	b.End = time.Now()
	if progress != nil {
		fmt.Fprintln(progress)
	}
	log.Info("loadgen finished", "published", b.Published, "invalid", b.Invalid, "changes", b.Changes,
		"rate", fmt.Sprintf("%.0f/s", float64(b.Published)/b.End.Sub(b.Start).Seconds()))
	return b, nil
}

// confirmWindow is the most messages that are unconfirmed; when it is full the oldest is
// waited for, so RabbitMQ always has work (the bare publisher of internal/baseline does the
// same).
const confirmWindow = 2000

// generator is one run's publisher: the fleet's books so far and the publishes RabbitMQ has
// yet to confirm.
type generator struct {
	c      Config
	ch     *amqp.Channel
	rng    *rand.Rand
	silent int // the first silent sensors report once, first
	b      Books
	live   *Live
	// The counts of live when the run began: live may carry counts of an earlier run.
	base, baseInvalid, baseChanges int64
	pending                        []*amqp.DeferredConfirmation
	valid                          int64 // valid readings sent
}

func newGenerator(c Config, ch *amqp.Channel) *generator {
	g := &generator{c: c, ch: ch, rng: rand.New(rand.NewPCG(c.Seed, c.Seed^0x9e3779b97f4a7c15)),
		silent: int(float64(c.Sensors) * c.SilentRatio), live: c.Live}
	g.b = Books{Last: make(map[string]uint8, c.Sensors), LastAt: make(map[string]time.Time, c.Sensors),
		ChangesOf: make(map[string]int64, c.Sensors), Start: time.Now()}
	for n := range g.silent {
		g.b.Silent = append(g.b.Silent, SensorID(c.Prefix, n))
	}
	for id, d := range c.Last {
		g.b.Last[id] = d
	}
	if g.live == nil {
		g.live = new(Live)
	}
	g.base = g.live.Published.Load()
	g.baseInvalid, g.baseChanges = g.live.Invalid.Load(), g.live.Changes.Load()
	g.pending = make([]*amqp.DeferredConfirmation, 0, confirmWindow)
	return g
}

// books are the run's books so far. The invalid messages and the changes are counted in
// live only; the books take this run's share of them.
func (g *generator) books() Books {
	g.b.Invalid, g.b.Changes = g.live.Invalid.Load()-g.baseInvalid, g.live.Changes.Load()-g.baseChanges
	return g.b
}

// showProgress writes a line a second to w until stop is closed.
func (g *generator) showProgress(w io.Writer, stop <-chan struct{}) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	last, lastT := int64(0), time.Now()
	for {
		select {
		case <-stop:
			return
		case now := <-t.C:
			p := g.live.Published.Load() - g.base
			fmt.Fprintf(w, "\rloadgen: %d published, %.0f/s, %s elapsed   ",
				p, float64(p-last)/now.Sub(lastT).Seconds(), now.Sub(g.b.Start).Round(time.Second))
			last, lastT = p, now
		}
	}
}

// publish sends message i, valid or not, and waits for the oldest confirm when the window
// is full.
func (g *generator) publish(ctx context.Context, i int64) error {
	now := time.Now().UTC()
	var body []byte
	if g.rng.Float64() < g.c.InvalidRatio {
		body = fmt.Appendf(nil, `{"sensor_id":"bad sensor %d","data":1}`, i)
		g.live.Invalid.Add(1)
	} else {
		body = g.reading(now)
	}
	dc, err := g.ch.PublishWithDeferredConfirmWithContext(ctx, "", g.c.Queue, false, false, amqp.Publishing{
		DeliveryMode: amqp.Persistent, ContentType: "application/json", Timestamp: now,
		MessageId: fmt.Sprintf("lg-%d-%d", g.c.Seed, i), Body: body,
	})
	if err != nil {
		return fmt.Errorf("loadgen: publish: %w", err)
	}
	g.pending = append(g.pending, dc)
	if len(g.pending) == confirmWindow {
		if err := g.confirmed(ctx, g.pending[0]); err != nil {
			return err
		}
		g.pending = g.pending[1:]
	}
	return nil
}

// reading is the next valid reading, of the next sensor in turn: its first one is random,
// a later one differs from its last with ChangeRatio.
func (g *generator) reading(now time.Time) []byte {
	id := SensorID(g.c.Prefix, g.sensor(g.valid))
	g.valid++
	prev, seen := g.b.Last[id]
	d := prev
	if !seen {
		d = uint8(g.rng.IntN(2))
		g.live.Changes.Add(1)
		g.b.ChangesOf[id]++
	} else if g.rng.Float64() < g.c.ChangeRatio {
		d = 1 - prev
		g.live.Changes.Add(1)
		g.b.ChangesOf[id]++
	}
	g.b.Last[id], g.b.LastAt[id] = d, now
	return fmt.Appendf(nil, `{"sensor_id":%q,"data":%d,"ts":%q}`, id, d, now.Format(time.RFC3339Nano))
}

// sensor is the number of the sensor of valid reading i: silent sensors report once,
// first; the rest go round-robin.
func (g *generator) sensor(i int64) int {
	if i < int64(g.silent) {
		return int(i)
	}
	active := g.c.Sensors - g.silent
	return g.silent + int((i-int64(g.silent))%int64(active))
}

// confirmed waits for RabbitMQ's confirm of p and counts it published.
func (g *generator) confirmed(ctx context.Context, p *amqp.DeferredConfirmation) error {
	ok, err := p.WaitContext(ctx)
	if err != nil {
		return err
	}
	if !ok {
		return errors.New("loadgen: RabbitMQ refused a message (nack)")
	}
	g.live.Published.Add(1)
	return nil
}

// flush waits for every pending confirm.
func (g *generator) flush(ctx context.Context) error {
	for _, p := range g.pending {
		if err := g.confirmed(ctx, p); err != nil {
			return err
		}
	}
	g.pending = g.pending[:0]
	return nil
}
