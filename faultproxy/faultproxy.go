// Package faultproxy is a TCP proxy that injects network faults between a
// client and one upstream address, for tests: a cut (every connection
// closed, new ones refused), a black hole (connections stay open, nothing is
// forwarded), latency per direction, and a restore. It is what the process
// tests put between each worker and NATS.
//
// It listens on loopback only and forwards to one address; it is no
// general-purpose proxy (no TLS, no bandwidth limits, no partial faults of
// one direction but latency). Data held by a black hole is delivered, in
// order, when it is lifted, as TCP's retransmissions would deliver it once
// a network partition heals; a connection that should die instead needs a
// Cut.
package faultproxy

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Proxy forwards connections from its loopback address to an upstream
// address, with the faults set on it. It is safe for concurrent use.
type Proxy struct {
	ln       net.Listener
	upstream string

	mu      sync.Mutex
	conns   map[*link]struct{}
	cut     bool
	open    chan struct{} // closed while data may flow (no black hole)
	toUp    time.Duration // latency client -> upstream
	toDown  time.Duration // latency upstream -> client
	closed  bool
	held    atomic.Int64 // bytes read and not yet written
	accepts sync.WaitGroup
}

// link is one proxied connection: the client's side and the upstream's.
type link struct {
	client, up net.Conn
	once       sync.Once
	done       chan struct{} // closed by close
}

func (l *link) close() {
	l.once.Do(func() {
		close(l.done)
		for _, c := range []net.Conn{l.client, l.up} {
			if tc, ok := c.(*net.TCPConn); ok {
				tc.SetLinger(0) // a reset, as a failed network path looks to the peers
			}
			c.Close()
		}
	})
}

// New starts a proxy on 127.0.0.1 (a free port) to upstream (host:port).
func New(upstream string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("faultproxy: listen: %w", err)
	}
	p := &Proxy{ln: ln, upstream: upstream, conns: map[*link]struct{}{}, open: make(chan struct{})}
	close(p.open)
	p.accepts.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's listening address (127.0.0.1:port).
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Held is how many bytes the proxy has read from one side and not yet
// written to the other (held by a black hole or by latency).
func (p *Proxy) Held() int64 { return p.held.Load() }

// Cut closes every connection (with a reset) and refuses new ones until
// Restore: the link is known down to both peers at once.
func (p *Proxy) Cut() {
	p.mu.Lock()
	p.cut = true
	conns := p.conns
	p.conns = map[*link]struct{}{}
	p.mu.Unlock()
	for l := range conns {
		l.close()
	}
}

// BlackHole keeps every connection open and accepts new ones, but forwards
// nothing in either direction until Restore: neither peer learns that the
// link is down, except by timeouts of its own.
func (p *Proxy) BlackHole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.open:
		p.open = make(chan struct{})
	default: // already
	}
}

// Latency delays every chunk of data read from now on: by toUpstream on its
// way from the client to the upstream, by toClient on the way back. Order is
// kept; throughput is not limited.
func (p *Proxy) Latency(toUpstream, toClient time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.toUp, p.toDown = toUpstream, toClient
}

// Restore lifts every fault: connections are accepted again, data held by a
// black hole flows (in order), latency is 0.
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = false
	p.toUp, p.toDown = 0, 0
	select {
	case <-p.open:
	default:
		close(p.open)
	}
}

// Close stops listening and closes every connection.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	conns := p.conns
	p.conns = map[*link]struct{}{}
	p.mu.Unlock()
	err := p.ln.Close()
	for l := range conns {
		l.close()
	}
	p.accepts.Wait()
	return err
}

func (p *Proxy) accept() {
	defer p.accepts.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		p.mu.Lock()
		refuse := p.cut || p.closed
		p.mu.Unlock()
		if refuse {
			if tc, ok := c.(*net.TCPConn); ok {
				tc.SetLinger(0)
			}
			c.Close()
			continue
		}
		up, err := net.DialTimeout("tcp", p.upstream, 5*time.Second)
		if err != nil {
			c.Close()
			continue
		}
		l := &link{client: c, up: up, done: make(chan struct{})}
		p.mu.Lock()
		if p.cut || p.closed {
			p.mu.Unlock()
			l.close()
			continue
		}
		p.conns[l] = struct{}{}
		p.mu.Unlock()
		go p.pipe(l, c, up, true)
		go p.pipe(l, up, c, false)
	}
}

type chunk struct {
	b  []byte
	at time.Time // when it may be written
}

// pipe copies src to dst through a queue, so that latency delays each
// chunk from when it was read and a black hole holds it, without stopping
// the reads (the peer's writes do not block, as on a real network).
func (p *Proxy) pipe(l *link, src, dst net.Conn, up bool) {
	q := make(chan chunk, 1<<14)
	go func() {
		defer close(q)
		for {
			b := make([]byte, 32<<10)
			n, err := src.Read(b)
			if n > 0 {
				p.mu.Lock()
				d := p.toDown
				if up {
					d = p.toUp
				}
				p.mu.Unlock()
				p.held.Add(int64(n))
				q <- chunk{b: b[:n], at: time.Now().Add(d)}
			}
			if err != nil {
				return
			}
		}
	}()
	defer func() {
		// One direction ended (EOF, an error, a cut): the connection ends,
		// as a NATS connection does; drain so that the reader ends too.
		l.close()
		for c := range q {
			p.held.Add(-int64(len(c.b)))
		}
		p.mu.Lock()
		delete(p.conns, l)
		p.mu.Unlock()
	}()
	for c := range q {
		if d := time.Until(c.at); d > 0 {
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-l.done:
				t.Stop()
				return
			}
		}
		p.mu.Lock()
		open := p.open
		p.mu.Unlock()
		select {
		case <-open:
		case <-l.done:
			return
		}
		_, err := dst.Write(c.b)
		p.held.Add(-int64(len(c.b)))
		if err != nil {
			return
		}
	}
}
