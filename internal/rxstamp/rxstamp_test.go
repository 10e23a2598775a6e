package rxstamp_test

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/internal/rxstamp"
)

// slowAccept accepts each connection only after a delay: a test process
// that gets to its requests late.
type slowAccept struct {
	net.Listener
	delay time.Duration
}

func (l slowAccept) Accept() (net.Conn, error) {
	time.Sleep(l.delay)
	return l.Listener.Accept()
}

// TestArrivalIsTheKernelsReceiveTime: a request written at once to a
// server that reads it 200 ms later arrives, by Arrival, when it was
// written, while the handler's own clock says 200 ms later; a second
// request on the same connection has its own stamp.
func TestArrivalIsTheKernelsReceiveTime(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	type seen struct{ arrival, handled time.Time }
	got := make(chan seen, 2)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- seen{rxstamp.Arrival(r), time.Now()}
	})}
	const late = 200 * time.Millisecond
	go srv.Serve(slowAccept{rxstamp.Serve(srv, ln), late})
	t.Cleanup(func() { srv.Close() })

	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	for i := range 2 {
		sent := time.Now()
		fmt.Fprintf(c, "GET /%d HTTP/1.1\r\nHost: x\r\n\r\n", i)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		s := <-got
		t.Logf("request %d: arrival %s after the write, handled %s after it", i, s.arrival.Sub(sent), s.handled.Sub(sent))
		if d := s.arrival.Sub(sent); d < -time.Millisecond || d > late/2 {
			t.Errorf("request %d: arrival %s after the write, want about 0", i, d)
		}
		if i == 0 && s.handled.Sub(s.arrival) < late/2 {
			t.Errorf("the handler ran %s after the arrival: the test's late accept did not happen", s.handled.Sub(s.arrival))
		}
	}
}
