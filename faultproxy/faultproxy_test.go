package faultproxy_test

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/faultproxy"
)

// echoServer answers every line with the same line, and counts the bytes it
// received, on loopback.
type echoServer struct {
	ln       net.Listener
	received atomic.Int64
}

func newEchoServer(t *testing.T) *echoServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &echoServer{ln: ln}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					s.received.Add(int64(len(line)))
					if err != nil {
						return
					}
					if _, err := io.WriteString(c, line); err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return s
}

func newProxy(t *testing.T, upstream string) *faultproxy.Proxy {
	t.Helper()
	p, err := faultproxy.New(upstream)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func dial(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, bufio.NewReader(c)
}

// roundTrip writes a line and reads the echo, with a generous deadline.
func roundTrip(c net.Conn, r *bufio.Reader, line string) (string, error) {
	c.SetDeadline(time.Now().Add(20 * time.Second))
	defer c.SetDeadline(time.Time{})
	if _, err := io.WriteString(c, line); err != nil {
		return "", err
	}
	return r.ReadString('\n')
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestForwards(t *testing.T) {
	s := newEchoServer(t)
	p := newProxy(t, s.ln.Addr().String())
	c, r := dial(t, p.Addr())
	for _, line := range []string{"one\n", "two\n"} {
		got, err := roundTrip(c, r, line)
		if err != nil || got != line {
			t.Fatalf("echo of %q = %q, %v", line, got, err)
		}
	}
}

// TestLatencyDelaysEachDirection: a round trip takes at least the sum of
// both directions' latency, and Restore removes it for data read afterwards.
func TestLatencyDelaysEachDirection(t *testing.T) {
	s := newEchoServer(t)
	p := newProxy(t, s.ln.Addr().String())
	c, r := dial(t, p.Addr())
	p.Latency(150*time.Millisecond, 100*time.Millisecond)
	t0 := time.Now()
	if got, err := roundTrip(c, r, "slow\n"); err != nil || got != "slow\n" {
		t.Fatalf("echo = %q, %v", got, err)
	}
	if rtt := time.Since(t0); rtt < 250*time.Millisecond {
		t.Errorf("round trip %s with 150 ms + 100 ms of latency, want at least 250 ms", rtt)
	}
	p.Restore()
	if got, err := roundTrip(c, r, "fast\n"); err != nil || got != "fast\n" {
		t.Fatalf("echo after restore = %q, %v", got, err)
	}
}

// TestBlackHoleHoldsThenDelivers: under a black hole the connection stays
// open and the write succeeds, but the upstream receives nothing; once
// restored, the held data arrives in order and the echo comes back.
func TestBlackHoleHoldsThenDelivers(t *testing.T) {
	s := newEchoServer(t)
	p := newProxy(t, s.ln.Addr().String())
	c, r := dial(t, p.Addr())
	if _, err := roundTrip(c, r, "warm\n"); err != nil {
		t.Fatal(err)
	}
	before := s.received.Load()
	p.BlackHole()
	if _, err := io.WriteString(c, "held-1\nheld-2\n"); err != nil {
		t.Fatalf("write into the black hole: %v (want it accepted)", err)
	}
	waitFor(t, "the proxy to hold the data", func() bool { return p.Held() >= int64(len("held-1\nheld-2\n")) })
	if got := s.received.Load() - before; got != 0 {
		t.Fatalf("upstream received %d bytes through a black hole", got)
	}
	// A connection made during the black hole is accepted, and as silent.
	c2, r2 := dial(t, p.Addr())
	if _, err := io.WriteString(c2, "new\n"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the proxy to hold the new connection's data", func() bool { return p.Held() >= int64(len("held-1\nheld-2\nnew\n")) })
	if got := s.received.Load() - before; got != 0 {
		t.Fatalf("upstream received %d bytes through a black hole", got)
	}
	p.Restore()
	c.SetDeadline(time.Now().Add(20 * time.Second))
	for _, want := range []string{"held-1\n", "held-2\n"} {
		if got, err := r.ReadString('\n'); err != nil || got != want {
			t.Fatalf("after restore read %q, %v; want %q", got, err, want)
		}
	}
	c2.SetDeadline(time.Now().Add(20 * time.Second))
	if got, err := r2.ReadString('\n'); err != nil || got != "new\n" {
		t.Fatalf("new connection after restore read %q, %v", got, err)
	}
}

// TestCutClosesAndRefuses: a cut ends open connections at once (the client
// reads an error, not silence) and refuses new ones until Restore.
func TestCutClosesAndRefuses(t *testing.T) {
	s := newEchoServer(t)
	p := newProxy(t, s.ln.Addr().String())
	c, r := dial(t, p.Addr())
	if _, err := roundTrip(c, r, "warm\n"); err != nil {
		t.Fatal(err)
	}
	p.Cut()
	c.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := r.ReadString('\n'); err == nil {
		t.Fatal("read on a cut connection succeeded")
	} else if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatal("a cut connection went silent instead of failing")
	}
	// The cut proxy resets what it accepts: the reset may reach the client
	// before its connect returns (a loaded machine) or after; either way
	// no data passes.
	if c2, err := net.DialTimeout("tcp", p.Addr(), 5*time.Second); err == nil {
		t.Cleanup(func() { c2.Close() })
		if _, err := roundTrip(c2, bufio.NewReader(c2), "refused?\n"); err == nil {
			t.Fatal("a connection made during the cut carried data")
		}
	}
	p.Restore()
	c3, r3 := dial(t, p.Addr())
	if got, err := roundTrip(c3, r3, "back\n"); err != nil || got != "back\n" {
		t.Fatalf("after restore echo = %q, %v", got, err)
	}
}
