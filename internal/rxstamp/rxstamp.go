// Package rxstamp times each request an HTTP test server receives by when
// the host's kernel received its bytes (SO_TIMESTAMPNS on the accepted TCP
// connection), not by when a handler got to run.
//
// The origins of the process tests run inside the test binary, beside an
// embedded JetStream server, proxies and the test's own work. On a loaded
// machine that process can go unscheduled for a hundred milliseconds and
// more, and every handler that runs after such a stall reads a late
// time.Now(): requests that reached the host correctly spaced look closer
// than the floor (a TestProcessClusterNetworkFaults run saw 22 ms between
// two arrivals that its pods had started 315 ms apart). The kernel's
// receive time does not wait for the process. What happens before the bytes
// reach the host (a pod's request delayed on its way out) still counts.
//
// Linux only; where the option cannot be set, Arrival falls back to the
// handler's time.Now(). It is for test origins: the tests' own and the
// stub origin's arrival gaps (package stuborigin), never for what a
// worker decides.
package rxstamp

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"io"
	"net"
	"net/http"
	"sync"
	"syscall"
	"time"
)

// Serve makes srv time its requests (call it before srv starts): its
// listener's connections are stamped, and Arrival finds their stamps. The
// listener may then be wrapped in TLS (httptest.Server.StartTLS): Arrival
// finds the stamp under the TLS connection, of the last record read.
func Serve(srv *http.Server, ln net.Listener) net.Listener {
	srv.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
		if tc, ok := c.(*tls.Conn); ok {
			c = tc.NetConn()
		}
		return context.WithValue(ctx, connKey{}, c)
	}
	// Set on the listening socket too, so that each accepted one has it
	// from the start: the first request of a connection often arrives
	// before Accept returns, and bytes received before the option was set
	// carry no stamp.
	if stampListener(ln) {
		awaitStamps(5 * time.Second)
	}
	return listener{ln}
}

// stampListener sets SO_TIMESTAMPNS on ln's socket, if it has one.
func stampListener(ln net.Listener) bool {
	sc, ok := ln.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_TIMESTAMPNS, 1)
	}); err != nil || serr != nil {
		return false
	}
	return true
}

// awaitStamps returns once the kernel stamps the TCP segments it receives
// on loopback, or after timeout. Linux stamps a segment on receipt only
// while some socket of the host asks for stamps, and it turns that on for
// the first such socket from a work queue, not in the setsockopt: for a
// while after it, segments arrive unstamped, and a request in them would
// be timed by the handler's clock (a CI run saw the first request of a
// fresh test process 200 ms late; 11 runs in 30 did, alone). The socket
// Serve has just set keeps it on, so one probe connection that sees a
// stamp is enough.
func awaitStamps(timeout time.Duration) {
	probe, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil || !stampListener(probe) {
		return
	}
	defer probe.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := listener{probe}.Accept()
		if err != nil {
			c = nil
		}
		accepted <- c
	}()
	out, err := net.Dial("tcp", probe.Addr().String())
	if err != nil {
		return
	}
	defer out.Close()
	in := <-accepted
	if in == nil {
		return
	}
	defer in.Close()
	c, ok := in.(*conn)
	if !ok {
		return
	}
	deadline := time.Now().Add(timeout)
	in.SetReadDeadline(deadline)
	var b [1]byte
	for time.Now().Before(deadline) {
		if _, err := out.Write(b[:]); err != nil {
			return
		}
		if _, err := in.Read(b[:]); err != nil {
			return
		}
		c.mu.Lock()
		stamped := !c.last.IsZero()
		c.mu.Unlock()
		if stamped {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

type connKey struct{}

// Arrival is when the kernel received the latest bytes of r's connection
// read before the handler ran: r's own for a request in one read (any GET
// of a test). Without a stamp it is time.Now().
func Arrival(r *http.Request) time.Time {
	if c, ok := r.Context().Value(connKey{}).(*conn); ok {
		c.mu.Lock()
		at := c.last
		c.mu.Unlock()
		if !at.IsZero() {
			return at
		}
	}
	return time.Now()
}

type listener struct{ net.Listener }

func (l listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return c, err
	}
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return c, nil
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return c, nil
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_TIMESTAMPNS, 1)
	}); err != nil || serr != nil {
		return c, nil
	}
	return &conn{Conn: tc, rc: rc}, nil
}

// conn reads with recvmsg to get the receive time of what it reads. It
// embeds net.Conn, not *net.TCPConn, so that nothing reads past Read.
type conn struct {
	net.Conn
	rc syscall.RawConn

	mu   sync.Mutex
	last time.Time
}

func (c *conn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	var (
		n, oobn int
		err     error
		oob     [64]byte
	)
	// RawConn.Read waits for the connection to be readable and honours
	// the read deadline (the server's abort of its background read).
	if rerr := c.rc.Read(func(fd uintptr) bool {
		n, oobn, _, _, err = syscall.Recvmsg(int(fd), p, oob[:], 0)
		return err != syscall.EAGAIN
	}); rerr != nil {
		return 0, rerr
	}
	if err != nil {
		return 0, &net.OpError{Op: "read", Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
	}
	if n == 0 {
		return 0, io.EOF
	}
	if at, ok := stamp(oob[:oobn]); ok {
		c.mu.Lock()
		c.last = at
		c.mu.Unlock()
	}
	return n, nil
}

// stamp finds the SCM_TIMESTAMPNS message (a struct timespec) in oob.
func stamp(oob []byte) (time.Time, bool) {
	msgs, err := syscall.ParseSocketControlMessage(oob)
	if err != nil {
		return time.Time{}, false
	}
	for _, m := range msgs {
		if m.Header.Level == syscall.SOL_SOCKET && m.Header.Type == syscall.SO_TIMESTAMPNS && len(m.Data) >= 16 {
			sec := int64(binary.NativeEndian.Uint64(m.Data[0:8]))
			nsec := int64(binary.NativeEndian.Uint64(m.Data[8:16]))
			return time.Unix(sec, nsec), true
		}
	}
	return time.Time{}, false
}
