package ui

import (
	"log/slog"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"
)

// Sign-in throttling: each client address that keeps giving wrong tokens waits longer and
// longer before its next attempt is even looked at, and its refusals are logged as one line
// per address per interval with a count, so that a flood neither guesses tokens quickly nor
// fills LOGS (5,000 messages) with refusals and pushes real errors out of the log panel.

const (
	// signinFreeFailures are the wrong tokens an address may give before it has to wait.
	signinFreeFailures = 3
	// signinDelayMax caps the wait.
	signinDelayMax = 5 * time.Minute
	// signinForget is how long an address's failures are remembered after its last one.
	signinForget = 15 * time.Minute
	// signinLogEvery is the interval of the aggregated refusal lines.
	signinLogEvery = time.Minute
	// signinMaxAddrs bounds the addresses remembered; the stalest are forgotten first.
	signinMaxAddrs = 10_000
	// signinLogLines bounds the lines of one interval; the other addresses are summed.
	signinLogLines = 10
)

// signinDelay is how long an address must wait after its failures-th wrong token: nothing
// for the first signinFreeFailures, then 1 s, doubling up to signinDelayMax.
func signinDelay(failures int) time.Duration {
	if failures < signinFreeFailures {
		return 0
	}
	d := time.Second
	for range failures - signinFreeFailures {
		d *= 2
		if d >= signinDelayMax {
			return signinDelayMax
		}
	}
	return d
}

type signinAddr struct {
	failures int
	last     time.Time // last failure
	logged   bool      // its first refusal of the interval was logged at once
	refused  int       // wrong tokens since the last log line
	delayed  int       // attempts refused unread (too early) since the last log line
}

// signinGuard remembers, per client address, the wrong tokens it gave.
type signinGuard struct {
	log *slog.Logger

	mu      sync.Mutex
	addrs   map[string]*signinAddr
	flushed time.Time
	firsts  int // first refusals logged at once this interval
}

func newSigninGuard(log *slog.Logger) *signinGuard {
	return &signinGuard{log: log, addrs: map[string]*signinAddr{}}
}

// clientAddr is the address a request came from: the connection's, never a forwarding
// header a client can write itself.
func clientAddr(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// wait is how long addr must still wait before an attempt is read (0: go ahead); a refused
// early attempt is counted for the log.
func (g *signinGuard) wait(addr string, now time.Time) time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	defer g.flush(now)
	a := g.addrs[addr]
	if a == nil {
		return 0
	}
	left := a.last.Add(signinDelay(a.failures)).Sub(now)
	if left <= 0 {
		return 0
	}
	a.delayed++
	return left
}

// failed records a wrong token from addr.
func (g *signinGuard) failed(addr string, now time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	a := g.addrs[addr]
	if a == nil {
		if len(g.addrs) >= signinMaxAddrs {
			g.forgetStalest()
		}
		a = &signinAddr{}
		g.addrs[addr] = a
	}
	a.failures++
	a.last = now
	if !a.logged && g.firsts < signinLogLines {
		// An address's first refusal of an interval is logged at once (for the first few
		// addresses); the rest are summed at the end of the interval.
		a.logged = true
		g.firsts++
		g.log.Warn("dashboard sign-in refused: not an API token", "remote", addr, "failures", a.failures)
	} else {
		a.refused++
	}
	g.flush(now)
}

// succeeded forgets addr's failures.
func (g *signinGuard) succeeded(addr string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.addrs, addr)
}

// flush logs, once per signinLogEvery, one line per address with the refusals since its
// last line, and forgets addresses quiet for signinForget. Called with g.mu held.
func (g *signinGuard) flush(now time.Time) {
	if now.Sub(g.flushed) < signinLogEvery {
		return
	}
	g.flushed, g.firsts = now, 0
	type line struct {
		addr             string
		refused, delayed int
	}
	var lines []line
	for addr, a := range g.addrs {
		if a.refused > 0 || a.delayed > 0 {
			lines = append(lines, line{addr, a.refused, a.delayed})
		}
		a.refused, a.delayed, a.logged = 0, 0, false
		if now.Sub(a.last) > signinForget {
			delete(g.addrs, addr)
		}
	}
	slices.SortFunc(lines, func(x, y line) int { return (y.refused + y.delayed) - (x.refused + x.delayed) })
	var restAddrs, restRefused int
	for i, l := range lines {
		if i >= signinLogLines {
			restAddrs++
			restRefused += l.refused + l.delayed
			continue
		}
		g.log.Warn("dashboard sign-ins refused", "remote", l.addr, "wrong_tokens", l.refused, "too_early", l.delayed,
			"interval", signinLogEvery.String())
	}
	if restAddrs > 0 {
		g.log.Warn("dashboard sign-ins refused from more addresses", "addresses", restAddrs, "refused", restRefused,
			"interval", signinLogEvery.String())
	}
}

// forgetStalest drops the address whose last failure is oldest. Called with g.mu held.
func (g *signinGuard) forgetStalest() {
	var stalest string
	var at time.Time
	for addr, a := range g.addrs {
		if stalest == "" || a.last.Before(at) {
			stalest, at = addr, a.last
		}
	}
	delete(g.addrs, stalest)
}
