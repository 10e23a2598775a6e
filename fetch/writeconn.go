package fetch

import (
	"crypto/tls"
	"net"
	"sync/atomic"
)

// writeConn is every connection the client dials: it can call a function
// once its next write to the socket has returned (AfterNextWrite).
//
// net/http tells a request written (httptrace's WroteRequest) before it
// flushes its buffer to the socket: for an HTTP/1.1 GET the whole request
// is still in the buffer then. A caller that spaces requests from that
// instant (the worker's Pacer.Sent, ADR 0027) counts from before the bytes
// leave; a goroutine descheduled between the two (a loaded machine) lets
// the origin receive them later than the caller counted, and the next
// request closer than the floor. The write's return is when the bytes are
// with the kernel: on loopback, when the origin's kernel stamps them.
type writeConn struct {
	net.Conn
	after atomic.Pointer[func()]
}

func wrapWrites(c net.Conn, err error) (net.Conn, error) {
	if err != nil {
		return c, err
	}
	return &writeConn{Conn: c}, nil
}

func (c *writeConn) Write(b []byte) (int, error) {
	// Taken before the write: on loopback the origin can answer, and the
	// caller disarm f at the answer's first byte, before this goroutine is
	// back from the write to run it.
	f := c.after.Swap(nil)
	n, err := c.Conn.Write(b)
	if f != nil {
		(*f)()
	}
	return n, err
}

// AfterNextWrite makes f be called once, right after the next write to
// conn's socket returns (also a failed one: bytes may have left). conn is
// what net/http reports for a request (httptrace.GotConnInfo.Conn): a
// connection this package's client dialed, or a TLS connection over one.
// It returns a function that disarms f if it has not run (call it when the
// request is done, so that a later request's write on a shared HTTP/2
// connection does not run it), or nil, with f never called, when conn is
// not the client's. Arming again replaces an armed f. Safe for concurrent
// use; f runs on the writing goroutine, so it must not block.
func AfterNextWrite(conn net.Conn, f func()) (disarm func()) {
	if tc, ok := conn.(*tls.Conn); ok {
		conn = tc.NetConn()
	}
	wc, ok := conn.(*writeConn)
	if !ok {
		return nil
	}
	pf := &f
	wc.after.Store(pf)
	return func() { wc.after.CompareAndSwap(pf, nil) }
}
