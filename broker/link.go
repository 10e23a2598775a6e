package broker

import (
	"sync"
	"sync/atomic"

	"github.com/nats-io/nats.go"
)

// Link reports whether a connection is up, as nats.Conn.IsConnected does,
// without taking the connection's lock on every call. IsConnected
// read-locks the lock that every publish and request takes; the lease
// manager asks it for every grant and every request (cluster.Manager.Owns,
// twice a job). Over the embedded server's in-process connection, whose
// writes wait for the server to read them while nats.go's flusher holds
// that lock, the throughput benchmark waited on it about once a job; over
// loopback TCP 0.07 times (docs/adr/0036, tenth pass).
//
// Link keeps IsConnected's last answer and asks again only after the
// connection reported a change of status (nats.Conn.StatusChanged). nats.go
// reports a change under the connection's lock, and IsConnected waits for
// that lock, so the answer read after a report is the new status or a
// later one. A report dropped because the listener's buffer was full
// leaves reports pending, which make the next call ask again. So Up lags
// IsConnected only by the time nats.go takes between setting a status and
// reporting it (while it closes a connection, its subscriptions' cleanup)
// and by the calls in progress meanwhile.
//
// Use NewLink. Up is safe for concurrent use. The listener lives as long as
// the connection.
type Link struct {
	nc *nats.Conn
	ch chan nats.Status
	up atomic.Bool

	mu sync.Mutex // held while the pending reports are drained and the status read
}

// NewLink returns nc's Link.
func NewLink(nc *nats.Conn) *Link {
	l := &Link{nc: nc, ch: nc.StatusChanged(nats.CONNECTED, nats.CONNECTING, nats.RECONNECTING,
		nats.DISCONNECTED, nats.CLOSED, nats.DRAINING_SUBS, nats.DRAINING_PUBS)}
	l.up.Store(nc.IsConnected())
	return l
}

// Up reports whether the connection is up.
func (l *Link) Up() bool {
	if len(l.ch) == 0 {
		return l.up.Load()
	}
	// One caller at a time drains and reads, so that an older reading is
	// never stored over a newer one.
	l.mu.Lock()
	defer l.mu.Unlock()
	for len(l.ch) > 0 {
		<-l.ch
	}
	up := l.nc.IsConnected()
	l.up.Store(up)
	return up
}
