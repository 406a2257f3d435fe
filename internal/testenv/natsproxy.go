package testenv

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// NATSProxy stands between a part's NATS connection and the server, on loopback, and can
// lose one message the server sends: the pull answer that goes down with a NATS node,
// injected deterministically. Everything else passes unchanged both ways.
type NATSProxy struct {
	// URL is what the part connects to.
	URL    string
	target string
	ln     net.Listener

	mu    sync.Mutex
	drops []*drop
	loses map[*lose]bool
	conns []net.Conn
	held  bool // messages from the server are lost while held
	delay time.Duration
}

type lose struct {
	match func(subject, reply string, body []byte) bool
}

type drop struct {
	match func(subject, reply string, body []byte) bool
	done  chan string
}

// NewNATSProxy proxies to the NATS server at target (host:port or nats://host:port) until
// the end of the test.
func NewNATSProxy(t testing.TB, target string) *NATSProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if u, ok := bytes.CutPrefix([]byte(target), []byte("nats://")); ok {
		target = string(u)
	}
	p := &NATSProxy{URL: "nats://" + ln.Addr().String(), target: target, ln: ln}
	go p.accept()
	t.Cleanup(func() {
		_ = ln.Close()
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, c := range p.conns {
			_ = c.Close()
		}
	})
	return p
}

// DropOne arms the proxy: the next message the server sends whose subject and reply subject
// match is not passed on. The channel receives its reply subject (for a JetStream delivery,
// $JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>...) when it is dropped.
func (p *NATSProxy) DropOne(match func(subject, reply string) bool) <-chan string {
	return p.DropBody(func(subject, reply string, _ []byte) bool { return match(subject, reply) })
}

// DropBody is DropOne with the message's payload (headers included) to match on too: the
// answer to one kind of JetStream API request, say.
func (p *NATSProxy) DropBody(match func(subject, reply string, body []byte) bool) <-chan string {
	d := &drop{match: match, done: make(chan string, 1)}
	p.mu.Lock()
	p.drops = append(p.drops, d)
	p.mu.Unlock()
	return d.done
}

// DropNth arms the proxy to lose the n-th message (from 1) whose reply subject starts with
// prefix: for a JetStream consumer "$JS.ACK.<stream>.<consumer>.", its n-th delivery.
func (p *NATSProxy) DropNth(prefix string, n int) <-chan string {
	seen := 0 // counted under p.mu, where take calls the match
	return p.DropOne(func(_, reply string) bool {
		if !strings.HasPrefix(reply, prefix) {
			return false
		}
		seen++
		return seen == n
	})
}

// Hold loses every message the server sends (MSG and HMSG; the protocol's other lines still
// pass) while on: the answers to what a part sends then never reach it.
func (p *NATSProxy) Hold(on bool) {
	p.mu.Lock()
	p.held = on
	p.mu.Unlock()
}

// Lose loses every message the server sends that match selects (its subject, reply subject and
// payload, headers included), until the returned function is called: a stream that answers
// nothing while it elects a leader, say, with everything else passing.
func (p *NATSProxy) Lose(match func(subject, reply string, body []byte) bool) (stop func()) {
	l := &lose{match: match}
	p.mu.Lock()
	if p.loses == nil {
		p.loses = map[*lose]bool{}
	}
	p.loses[l] = true
	p.mu.Unlock()
	return func() {
		p.mu.Lock()
		delete(p.loses, l)
		p.mu.Unlock()
	}
}

// Delay holds what the server sends for d before the client gets it, in order: a client on
// a busy machine, or far from its server. Set it before the client connects.
func (p *NATSProxy) Delay(d time.Duration) {
	p.mu.Lock()
	p.delay = d
	p.mu.Unlock()
}

// Cut closes every connection through the proxy, as the death of the NATS node would; the
// parts reconnect through it.
func (p *NATSProxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
}

// take reports whether a message is to be dropped, disarming the drop that matched.
func (p *NATSProxy) take(subject, reply string, body []byte) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.held {
		return true
	}
	for l := range p.loses {
		if l.match(subject, reply, body) {
			return true
		}
	}
	for i, d := range p.drops {
		if d.match(subject, reply, body) {
			p.drops = append(p.drops[:i], p.drops[i+1:]...)
			d.done <- reply
			return true
		}
	}
	return false
}

func (p *NATSProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		go func() { _, _ = io.Copy(s, c); _ = s.Close() }()
		p.mu.Lock()
		delay := p.delay
		p.mu.Unlock()
		go func() {
			if delay > 0 {
				c = delayed(c, delay)
			}
			p.serverToClient(s, c)
			_ = c.Close()
		}()
	}
}

// serverToClient copies the server's protocol to the client, message by message (MSG and
// HMSG with their payloads, the other operations line by line), leaving out what take says.
func (p *NATSProxy) serverToClient(s, c net.Conn) {
	r := bufio.NewReaderSize(s, 64<<10)
	w := bufio.NewWriterSize(c, 64<<10)
	for {
		line, err := r.ReadSlice('\n')
		if err != nil {
			return
		}
		out := append([]byte(nil), line...)
		f := bytes.Fields(line)
		keep := true
		if len(f) >= 4 && (string(f[0]) == "MSG" || string(f[0]) == "HMSG") {
			size, err := strconv.Atoi(string(f[len(f)-1]))
			if err != nil {
				return
			}
			body := make([]byte, size+2) // the payload and its CRLF
			if _, err := io.ReadFull(r, body); err != nil {
				return
			}
			out = append(out, body...)
			reply := ""
			if n := len(f); string(f[0]) == "MSG" && n == 5 || string(f[0]) == "HMSG" && n == 6 {
				reply = string(f[3])
			}
			keep = !p.take(string(f[1]), reply, body)
		}
		if keep {
			if _, err := w.Write(out); err != nil {
				return
			}
		}
		if r.Buffered() == 0 {
			if err := w.Flush(); err != nil {
				return
			}
		}
	}
}

// delayedConn writes to its connection what it is given d later, in order.
type delayedConn struct {
	net.Conn
	chunks chan delayedChunk
	done   chan struct{}
	close  sync.Once
}

type delayedChunk struct {
	at time.Time
	b  []byte
}

func delayed(c net.Conn, d time.Duration) net.Conn {
	dc := &delayedConn{Conn: c, chunks: make(chan delayedChunk, 4096), done: make(chan struct{})}
	go func() {
		defer close(dc.done)
		for ch := range dc.chunks {
			time.Sleep(time.Until(ch.at.Add(d)))
			if _, err := c.Write(ch.b); err != nil {
				return
			}
		}
	}()
	return dc
}

func (dc *delayedConn) Write(b []byte) (int, error) {
	select {
	case dc.chunks <- delayedChunk{at: time.Now(), b: append([]byte(nil), b...)}:
		return len(b), nil
	case <-dc.done:
		return 0, net.ErrClosed
	}
}

// Close is called by the goroutine that writes (serverToClient), once it is done.
func (dc *delayedConn) Close() error {
	dc.close.Do(func() { close(dc.chunks) })
	return dc.Conn.Close()
}
