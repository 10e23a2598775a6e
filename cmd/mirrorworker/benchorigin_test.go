package main

// The loopback origin of the throughput and memory benchmarks
// (throughput_bench_test.go): many authorities, each its own listener on its
// own loopback address, served by child processes (this test binary with
// benchOriginEnv set, see TestMain) so that their sockets count against the
// children's file limits and their CPU stays out of the benchmark's profile.

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// benchOriginEnv makes the test binary serve benchmark authorities:
// "first,count,port,bodySize". It is not a MIRRORWORKER_ variable.
const benchOriginEnv = "MW_BENCH_ORIGIN"

// benchDistinctEnv (MW_BENCH_DISTINCT=1) makes every object's body differ:
// it starts with the object's number, and keeps its size. Without it every
// object is the same bytes, so that each Put finds the sha256 index naming
// another key (ADR 0034); a real mirror's files mostly differ, and then a
// Put records a new entry (a bolt write) instead. The origin processes
// inherit it from the benchmark's environment.
const benchDistinctEnv = "MW_BENCH_DISTINCT"

// benchAuthsPerProcess bounds the authorities one origin process serves: a
// listener and up to about two connections each stay well within a file
// limit of 20,000.
const benchAuthsPerProcess = 5000

// benchHost is the loopback address of authority k: 127.a.b.c with every
// octet in 1..250, so 15 million authorities fit and none is 127.0.0.1.
func benchHost(k int) string {
	return fmt.Sprintf("127.%d.%d.%d", 1+k/(250*250), 1+(k/250)%250, 1+k%250)
}

// benchOriginMain serves the authorities named by spec until stdin closes.
// It answers GET /o/<n> with bodySize bytes and, on stdin, the commands
// "reset <w>" (zero the counters; jobs numbered w and up are measured) and
// "stats" (print: accepted connections, connections whose first request was
// a measured job, requests).
func benchOriginMain(spec string) error {
	var first, count, port, size int
	if _, err := fmt.Sscanf(spec, "%d,%d,%d,%d", &first, &count, &port, &size); err != nil {
		return fmt.Errorf("%s=%q: %v", benchOriginEnv, spec, err)
	}
	body := make([]byte, size)
	for i := range body {
		body[i] = byte('a' + i%26)
	}
	distinct := os.Getenv(benchDistinctEnv) != ""
	type connState struct{ seen atomic.Bool }
	type key struct{}
	var accepted, measured, requests atomic.Int64
	var warm atomic.Int64
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n, err := strconv.ParseInt(strings.TrimPrefix(r.URL.Path, "/o/"), 10, 64)
			if err != nil {
				http.NotFound(w, r)
				return
			}
			requests.Add(1)
			if cs, ok := r.Context().Value(key{}).(*connState); ok && !cs.seen.Swap(true) && n >= warm.Load() {
				measured.Add(1)
			}
			w.Header().Set("Content-Length", strconv.Itoa(len(body)))
			if distinct {
				b := slices.Clone(body)
				copy(b, strconv.AppendInt(nil, n, 10))
				w.Write(b)
				return
			}
			w.Write(body)
		}),
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			accepted.Add(1)
			return context.WithValue(ctx, key{}, &connState{})
		},
	}
	for k := first; k < first+count; k++ {
		ln, err := net.Listen("tcp", net.JoinHostPort(benchHost(k), strconv.Itoa(port)))
		if err != nil {
			return err
		}
		go srv.Serve(ln)
	}
	fmt.Println("ready")
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) == 2 && f[0] == "reset":
			w, _ := strconv.ParseInt(f[1], 10, 64)
			warm.Store(w)
			accepted.Store(0)
			measured.Store(0)
			requests.Store(0)
			fmt.Println("ok")
		case len(f) == 1 && f[0] == "stats":
			fmt.Println(accepted.Load(), measured.Load(), requests.Load())
		}
	}
	return nil
}

// benchOrigin is a set of origin processes serving authorities 0..n-1.
type benchOrigin struct {
	port  int
	procs []*benchOriginProc
}

type benchOriginProc struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
	mu  sync.Mutex
}

// startBenchOrigin starts the origin processes of n authorities serving
// bodySize-byte objects; they stop when the benchmark ends.
func startBenchOrigin(b testing.TB, n, bodySize int) *benchOrigin {
	b.Helper()
	exe, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	var lastErr error
	for range 5 {
		// A port below the ephemeral range, so that no client socket holds it.
		o := &benchOrigin{port: 20000 + rand.IntN(10000)}
		ok := true
		for first := 0; first < n; first += benchAuthsPerProcess {
			count := min(benchAuthsPerProcess, n-first)
			p := &benchOriginProc{cmd: exec.Command(exe)}
			p.cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d,%d,%d,%d", benchOriginEnv, first, count, o.port, bodySize))
			p.cmd.Stderr = os.Stderr
			if p.in, err = p.cmd.StdinPipe(); err != nil {
				b.Fatal(err)
			}
			stdout, err := p.cmd.StdoutPipe()
			if err != nil {
				b.Fatal(err)
			}
			p.out = bufio.NewScanner(stdout)
			if err := p.cmd.Start(); err != nil {
				b.Fatal(err)
			}
			o.procs = append(o.procs, p)
			if !p.out.Scan() || p.out.Text() != "ready" {
				lastErr = fmt.Errorf("origin process for authorities %d..%d did not start (port %d taken?)", first, first+count-1, o.port)
				ok = false
				break
			}
		}
		if ok {
			b.Cleanup(o.stop)
			return o
		}
		o.stop()
	}
	b.Fatal(lastErr)
	return nil
}

func (o *benchOrigin) stop() {
	for _, p := range o.procs {
		p.in.Close()
		done := make(chan struct{})
		go func() { p.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			p.cmd.Process.Kill()
			<-done
		}
	}
}

// url is the URL of job n at authority k.
func (o *benchOrigin) url(k, n int) string {
	return "http://" + net.JoinHostPort(benchHost(k), strconv.Itoa(o.port)) + "/o/" + strconv.Itoa(n)
}

func (p *benchOriginProc) command(cmd string) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, err := fmt.Fprintln(p.in, cmd); err != nil {
		return "", err
	}
	if !p.out.Scan() {
		return "", fmt.Errorf("origin process: no answer to %q", cmd)
	}
	return p.out.Text(), nil
}

// reset zeroes the counters; jobs numbered warm and up are measured.
func (o *benchOrigin) reset(b testing.TB, warm int) {
	b.Helper()
	for _, p := range o.procs {
		if _, err := p.command("reset " + strconv.Itoa(warm)); err != nil {
			b.Fatal(err)
		}
	}
}

// originStats are the origin's counters since the last reset.
type originStats struct {
	accepted int64 // TCP connections accepted
	measured int64 // connections whose first request was a measured job
	requests int64
}

func (o *benchOrigin) stats(b testing.TB) originStats {
	b.Helper()
	var s originStats
	for _, p := range o.procs {
		line, err := p.command("stats")
		if err != nil {
			b.Fatal(err)
		}
		var a, m, r int64
		if _, err := fmt.Sscanf(line, "%d %d %d", &a, &m, &r); err != nil {
			b.Fatalf("origin stats %q: %v", line, err)
		}
		s.accepted += a
		s.measured += m
		s.requests += r
	}
	return s
}
