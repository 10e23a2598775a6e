package fetch

import (
	"crypto/tls"
	"io"
	"net"
	"testing"
)

// TestAfterNextWrite: an armed function runs once, after the next write
// to the socket, found under a TLS connection too; a disarmed one never
// runs, and a connection the client did not dial cannot be armed.
func TestAfterNextWrite(t *testing.T) {
	tests := []struct {
		name   string
		tls    bool
		disarm bool
		writes int
		want   int
	}{
		{name: "one write", writes: 1, want: 1},
		{name: "runs once", writes: 3, want: 1},
		{name: "under TLS", tls: true, writes: 1, want: 1},
		{name: "disarmed", disarm: true, writes: 1, want: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, b := net.Pipe()
			defer a.Close()
			defer b.Close()
			go io.Copy(io.Discard, b)
			wc, err := wrapWrites(a, nil)
			if err != nil {
				t.Fatal(err)
			}
			conn := wc
			if tt.tls {
				conn = tls.Client(wc, &tls.Config{})
			}
			calls := 0
			disarm := AfterNextWrite(conn, func() { calls++ })
			if disarm == nil {
				t.Fatal("AfterNextWrite: not armed on the client's connection")
			}
			if tt.disarm {
				disarm()
			}
			for range tt.writes {
				if _, err := wc.Write([]byte("GET / HTTP/1.1\r\n\r\n")); err != nil {
					t.Fatal(err)
				}
			}
			if calls != tt.want {
				t.Errorf("called %d times, want %d", calls, tt.want)
			}
		})
	}
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if AfterNextWrite(a, func() {}) != nil {
		t.Error("armed on a connection the client did not dial")
	}
}
