package lease

import (
	"context"
	"errors"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/lock-sensors/lock-sensors/internal/natsx"
)

// bucket looks the lease bucket up, creating it when missing; an existing one is kept as an
// operator left it (replicas, storage).
func (a *Assigner) bucket(ctx context.Context) (jetstream.KeyValue, error) {
	kv, err := a.js.KeyValue(ctx, Bucket(a.cfg.Name))
	if err == nil {
		if st, serr := kv.Status(ctx); serr == nil && st.TTL() != a.cfg.TTL {
			a.log.Warn("the lease bucket's TTL differs from this process's; the bucket's applies", "bucket_ttl", st.TTL(), "ttl", a.cfg.TTL)
		}
		return kv, nil
	}
	if !errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, err
	}
	return a.js.CreateKeyValue(ctx, natsx.LeasesConfig(natsx.StreamsConfig{LeaseTTL: a.cfg.TTL}, a.cfg.Name))
}

// renewKey writes partition p's lease again over revision rev, the last this process wrote.
// Two mismatches still leave the lease this process's:
//   - the key names this owner at a newer revision: its own earlier renewal reached the server
//     after the client had given up waiting for the answer (only this process writes its
//     owner id), so it is written once more over that revision;
//   - the key is gone: the bucket's TTL removed it while no renewal could be written (the
//     bucket's stream was electing a leader), and nobody has taken it since, so it is created
//     again. Had another process claimed the partition in between, its claim bumped the
//     epoch, and the fence rolls this process's next transaction back.
//
// Any other mismatch means another process holds the lease now.
func (a *Assigner) renewKey(ctx context.Context, p int, rev uint64) (uint64, error) {
	key := partitionKey(p)
	n, err := a.kv.Update(ctx, key, []byte(a.cfg.Owner), rev)
	if !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return n, err
	}
	e, gerr := a.kv.Get(ctx, key)
	switch {
	case errors.Is(gerr, jetstream.ErrKeyNotFound) || errors.Is(gerr, jetstream.ErrKeyDeleted):
		n, cerr := a.kv.Create(ctx, key, []byte(a.cfg.Owner))
		if errors.Is(cerr, jetstream.ErrKeyExists) {
			return 0, err // taken in between
		}
		if cerr != nil {
			return 0, cerr // asked again next round
		}
		a.log.Warn("the lease had lapsed in its bucket while it could not be renewed; nobody had taken it, so it is held again", "partition", p)
		return n, nil
	case gerr != nil:
		return 0, gerr // asked again next round
	case string(e.Value()) != a.cfg.Owner || e.Revision() <= rev:
		return 0, err
	}
	a.log.Info("a renewal that timed out had reached the server: the lease is still this process's", "partition", p)
	return a.kv.Update(ctx, key, []byte(a.cfg.Owner), e.Revision())
}

// snapshot counts the live members (this one included) and the partitions with a lease.
func (a *Assigner) snapshot(ctx context.Context) (int, map[int]bool, error) {
	kl, err := a.kv.ListKeys(ctx)
	if err != nil {
		return 0, nil, err
	}
	defer kl.Stop()
	members, taken := 0, map[int]bool{}
	self := false
	for k := range kl.Keys() {
		if m, ok := strings.CutPrefix(k, memberPrefix); ok {
			members++
			self = self || m == a.cfg.Owner
		} else if n, ok := strings.CutPrefix(k, "p."); ok {
			if p, err := strconv.Atoi(n); err == nil {
				taken[p] = true
			}
		}
	}
	if ctx.Err() != nil {
		return 0, nil, ctx.Err()
	}
	if !self {
		members++
	}
	return members, taken, nil
}
