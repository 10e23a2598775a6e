// Package admin provides the worker's admin HTTP handler: /metrics,
// /healthz, /readyz and /debug/pacer.
//
// It knows nothing about NATS, the pacer or the worker: every answer comes
// from a function or gatherer the caller injects. It does not listen on a
// socket itself; Server does that for the command.
package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	stdlog "log"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"

	"github.com/mirrorworker/mirrorworker/fetch"
	"github.com/mirrorworker/mirrorworker/pacer"
)

// DefaultPort is the admin endpoint's port: not Prometheus's 9090, and the
// port Kubernetes operators commonly give health and metrics endpoints.
const DefaultPort = "8081"

// DefaultAddr is the admin endpoint's default address: every interface, so
// that kubelet probes and Prometheus can reach it inside a pod. On a shared
// host, bind it to 127.0.0.1 (--admin-addr, MIRRORWORKER_ADMIN_ADDR).
const DefaultAddr = ":" + DefaultPort

// Options configures the handler. A nil *Options, or a zero field, means the
// default noted on the field.
type Options struct {
	// Gatherer serves /metrics; nil serves an empty registry.
	Gatherer prometheus.Gatherer
	// Ready reports whether the worker can take jobs (connected, consumer
	// bound); /readyz answers 200 when it returns nil and 503 with the
	// error's text otherwise. Nil means never ready.
	Ready func() error
	// Pacer returns the tracked authorities for /debug/pacer; nil serves an
	// empty array.
	Pacer func() []pacer.State
	// Parked returns the jobs parked per authority (partitioned mode), shown
	// as "parked" beside each authority in /debug/pacer; nil: none.
	Parked func() map[string]int64
	// Fetches returns the fetches in flight by the authority row of
	// /debug/pacer they count against (an authority, or a politeness
	// group's "group:NAME"), shown as "fetches" in that row: URL, bytes so
	// far of expected, rate, elapsed. Nil: none.
	Fetches func() map[string][]fetch.Progress
	// Logger receives promhttp's errors; zero value logs nothing.
	Logger zerolog.Logger
}

// New returns the admin handler. It is safe for concurrent use as long as the
// injected functions are.
func New(o *Options) http.Handler {
	if o == nil {
		o = &Options{}
	}
	g := o.Gatherer
	if g == nil {
		g = prometheus.NewRegistry()
	}
	ready := o.Ready
	if ready == nil {
		ready = func() error { return errors.New("not started") }
	}
	snap := o.Pacer
	if snap == nil {
		snap = func() []pacer.State { return nil }
	}

	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{
		ErrorLog:      promLogger{o.Logger},
		ErrorHandling: promhttp.ContinueOnError,
	}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeText(w, http.StatusOK, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if err := ready(); err != nil {
			writeText(w, http.StatusServiceUnavailable, "not ready: "+err.Error())
			return
		}
		writeText(w, http.StatusOK, "ready")
	})
	mux.HandleFunc("GET /debug/pacer", func(w http.ResponseWriter, _ *http.Request) {
		type entry struct {
			pacer.State
			Parked  int64            `json:"parked,omitempty"`
			Fetches []fetch.Progress `json:"fetches,omitempty"`
		}
		var parked map[string]int64
		if o.Parked != nil {
			parked = o.Parked()
		}
		var fetches map[string][]fetch.Progress
		if o.Fetches != nil {
			fetches = o.Fetches()
		}
		var entries []entry
		for _, st := range snap() {
			entries = append(entries, entry{State: st, Parked: parked[st.Authority], Fetches: fetches[st.Authority]})
			delete(parked, st.Authority)
			delete(fetches, st.Authority)
		}
		for a, n := range parked { // parked for an authority the pacer has forgotten
			entries = append(entries, entry{State: pacer.State{Authority: a, State: pacer.StateIdle}, Parked: n, Fetches: fetches[a]})
			delete(fetches, a)
		}
		for a, fs := range fetches { // not in the snapshot taken a moment before
			entries = append(entries, entry{State: pacer.State{Authority: a, State: pacer.StateIdle}, Fetches: fs})
		}
		states := []json.RawMessage{} // "[]", never "null"
		for _, e := range entries {
			b, err := json.Marshal(e)
			if err == nil {
				b, err = durationsWritten(b)
			}
			if err != nil {
				writeText(w, http.StatusInternalServerError, err.Error())
				return
			}
			states = append(states, b)
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(states) // a failed write means the client went away
	})
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		writeText(w, http.StatusOK, "mirrorworker admin: /metrics /healthz /readyz /debug/pacer")
	})
	return mux
}

func writeText(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	fmt.Fprintln(w, msg)
}

type promLogger struct{ l zerolog.Logger }

func (p promLogger) Println(v ...any) { p.l.Warn().Msg(fmt.Sprint(v...)) }

// Server serves a handler on a listener that is bound when the server is
// created, so that "address in use" is reported before anything else starts
// and an ephemeral port (":0") is known at once. It is safe for concurrent
// use.
type Server struct {
	ln  net.Listener
	srv *http.Server
}

// Listen binds addr ("host:port"; port 0 picks a free one).
func Listen(addr string, h http.Handler) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("admin listen %s: %w", addr, err)
	}
	return &Server{ln: ln, srv: &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       60 * time.Second,
	}}, nil
}

// LogErrorsTo sends the HTTP server's own errors (a failed accept, a
// panicking handler) to l as warnings, instead of net/http's plain-text
// default on stderr. Call it before Run.
func (s *Server) LogErrorsTo(l zerolog.Logger) {
	s.srv.ErrorLog = stdlog.New(warnWriter{l}, "", 0)
}

// warnWriter writes each line it is given as a warning.
type warnWriter struct{ l zerolog.Logger }

func (w warnWriter) Write(p []byte) (int, error) {
	w.l.Warn().Str("component", "admin-http").Msg(strings.TrimSpace(string(p)))
	return len(p), nil
}

// Addr is the bound address (with the real port when ":0" was asked for).
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// URL is "http://host:port" for the bound address.
func (s *Server) URL() string { return "http://" + s.ln.Addr().String() }

// Run serves until ctx is done, then shuts down, giving open requests up to
// five seconds. It returns nil after a shutdown caused by ctx.
func (s *Server) Run(ctx context.Context) error {
	errc := make(chan error, 1)
	go func() { errc <- s.srv.Serve(s.ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("admin serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := s.srv.Shutdown(sctx)
	<-errc // Serve returns http.ErrServerClosed once Shutdown began
	if err != nil {
		return fmt.Errorf("admin shutdown: %w", err)
	}
	return nil
}

// Close releases the listener of a server whose Run was never called.
func (s *Server) Close() error { return s.srv.Close() }

// durationsWritten rewrites a flat JSON object's "<name>_ns" numbers (how
// pacer.State carries durations in MIRROR_PODS, which pods of several
// versions read) as "<name>": "1.5s", for the person reading /debug/pacer;
// every other field, and the order, stay as they are.
func durationsWritten(obj []byte) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(obj))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, fmt.Errorf("debug/pacer: not an object: %s", obj)
	}
	var out bytes.Buffer
	out.WriteByte('{')
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("debug/pacer: %w", err)
		}
		key, _ := t.(string)
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, fmt.Errorf("debug/pacer: %w", err)
		}
		if name, ok := strings.CutSuffix(key, "_ns"); ok {
			if ns, err := strconv.ParseInt(string(v), 10, 64); err == nil {
				key = name
				v, _ = json.Marshal(time.Duration(ns).String())
			}
		}
		if out.Len() > 1 {
			out.WriteByte(',')
		}
		k, _ := json.Marshal(key)
		out.Write(k)
		out.WriteByte(':')
		out.Write(v)
	}
	out.WriteByte('}')
	return out.Bytes(), nil
}
