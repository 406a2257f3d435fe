package notifier

import (
	"context"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lock-sensors/lock-sensors/internal/pgtx"
)

// The intake hands the pending deliveries it has just committed to the dispatcher, which
// leases exactly those rows (claimByID) instead of waiting for its next claim to find them
// among every due row: a new delivery's first attempt then waits for one short lease
// transaction. The rows are committed unleased, so a crash before their lease leaves them
// to the next claim at once; the lease takes the keys' advisory locks and re-checks the
// rows' eligibility like every claim. A busy dispatcher (no free slot, or a full hand-off
// queue) leaves them to its claims.

// pendingRow is a delivery the intake committed pending.
type pendingRow struct {
	id               int64
	client, sensorID string
}

// handoff carries the intake's new pending rows to the dispatcher.
type handoff struct{ rows chan []pendingRow }

func newHandoff() *handoff { return &handoff{rows: make(chan []pendingRow, 64)} }

// give passes rows to the dispatcher, or reports false when it is this far behind (its
// claims then find them).
func (h *handoff) give(rows []pendingRow) bool {
	select {
	case h.rows <- rows:
		return true
	default:
		return false
	}
}

// handOff gives the pending rows ins created to the dispatcher; it reports false when the
// dispatcher's claims are to find them instead.
func (n *Notifier) handOff(ins inserted) bool {
	if len(ins.ids) == 0 {
		return true
	}
	rows := make([]pendingRow, len(ins.ids))
	for i, id := range ins.ids {
		rows[i] = pendingRow{id: id, client: ins.clients[i], sensorID: ins.sensors[i]}
	}
	return n.handoff.give(rows)
}

// startHanded leases the handed rows that can be attempted now (free slots, room at their
// endpoints) and starts them; it reports how many it started. Rows it leaves stay for the claims.
func (n *Notifier) startHanded(ctx context.Context, wg *sync.WaitGroup, rows []pendingRow) int {
	now := n.clock.Now()
	free := min(n.cfg.MaxInFlight-int(n.inflight.Load()), n.cfg.Batch)
	var ids []int64
	var clients, sensors []string
	room := map[string]int{}
	for _, r := range rows {
		if len(ids) >= free {
			break
		}
		left, ok := room[r.client]
		if !ok {
			left = n.ep.room(r.client, now)
		}
		if left <= 0 {
			continue
		}
		room[r.client] = left - 1
		ids, clients, sensors = append(ids, r.id), append(clients, r.client), append(sensors, r.sensorID)
	}
	if len(ids) < len(rows) {
		poke(n.wake) // the rest is the claims'
	}
	if len(ids) == 0 {
		return 0
	}
	cs, err := claimByID(ctx, n.db, ids, clients, sensors, rand.Int64(), n.lease)
	if err != nil {
		if ctx.Err() == nil {
			n.log.Warn("lease new deliveries (the next claim takes them)", "err", err)
		}
		return 0
	}
	if len(cs) < len(ids) {
		poke(n.wake) // some were not eligible yet: the claims take them when they are
	}
	n.m.handedOff.Add(float64(len(cs)))
	return n.start(ctx, wg, cs, now)
}

// claimByID leases the rows of ids (with their clients and sensors) that are eligible, as
// claim does, without looking for candidates.
func claimByID(ctx context.Context, db pgtx.Pool, ids []int64, clients, sensors []string, token int64, lease time.Duration) ([]claimed, error) {
	return claimAmong(ctx, db, func(b *pgx.Batch) {
		queueClaimSettings(b)
		b.Queue(`SELECT id, sensor_id FROM unnest($1::bigint[], $2::text[], $3::text[]) AS k(id, client_id, sensor_id)
			WHERE `+keyLock, ids, clients, sensors)
		b.Queue(`SELECT set_config('enable_seqscan', 'off', true)`)
	}, token, lease)
}
