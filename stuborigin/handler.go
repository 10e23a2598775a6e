package stuborigin

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/mirrorworker/mirrorworker/internal/rxstamp"
)

// lastModified is the Last-Modified of every object: objects never change.
var lastModified = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// Handler returns the handler of authority i (0-based). Tests may serve it
// with their own server; the caller's network range is read from
// Request.RemoteAddr, so the server must not rewrite it.
func (og *Origin) Handler(i int) http.Handler {
	s := og.shards[i]
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { og.serve(s, w, r) })
}

// Arrival is one request as the origin saw it (Options.OnArrival).
type Arrival struct {
	Authority int    // 0-based
	Identity  string // the caller's identity key, as /stats labels it
	Remote    string // the caller's address: one per connection
	// Arrived is when the request arrived for the gap statistics: the
	// kernel's receive time where stamped, else Handled.
	Arrived time.Time
	// Handled is the handler's clock, by which admission decided.
	Handled time.Time
	Outcome Outcome
	// Early: it came before a deadline its identity had been told (what
	// /stats counts as early).
	Early bool
}

// Told is one answer that told its caller to wait (Options.OnTold): a
// Retry-After, or an exhausted rate-limit header's reset. With the
// Arrivals it tells which early request was sent after its caller had been
// told, and which was already on its way when the answer left.
type Told struct {
	Authority int    // 0-based
	Identity  string // the caller's identity key, as /stats labels it
	// Decided is the handler's clock when admission decided (Arrival's
	// Handled of the same request): from then on the identity's later
	// requests are early until Until.
	Decided time.Time
	// Written is the origin's clock just before the answer's first byte
	// was written: the answer left no sooner (net/http sends it when the
	// handler returns), so a request that left its client before Written
	// was on its way before any word of the answer was.
	Written time.Time
	Until   time.Time // the deadline the answer told
}

// problem is the JSON body of every refusal. It carries only the caller's
// own facts: a catalogue code, a reason about its own quota or the service,
// and the delay it was told.
type problem struct {
	Code              string `json:"code"`
	Reason            string `json:"reason,omitempty"`
	Message           string `json:"message"`
	RetryAfterSeconds *int64 `json:"retry_after_seconds,omitempty"`
}

func (og *Origin) serve(s *shard, w http.ResponseWriter, r *http.Request) {
	// The store's clock, never the request's Date header.
	now := og.clk.Now()
	arrived := now // for the gaps: the kernel's receive time where stamped
	if og.kernel {
		arrived = rxstamp.Arrival(r)
	}
	f := og.faults.Load()
	c, tokenOK := og.identify(r)
	d := s.admit(now, arrived, c, f.StoreDown && f.appliesTo(s.index), f.retryAfterFormat(s.index))
	if og.onArrival != nil {
		og.onArrival(Arrival{Authority: s.index, Identity: c.key, Remote: r.RemoteAddr,
			Arrived: arrived, Handled: now, Outcome: d.outcome, Early: d.early})
	}
	if d.hold > 0 && !og.tarpit(r, d.hold) {
		return // the caller gave up while held
	}
	if og.onTold != nil && !d.toldUntil.IsZero() {
		og.onTold(Told{Authority: s.index, Identity: c.key, Decided: now, Written: og.clk.Now(), Until: d.toldUntil})
	}

	h := w.Header()
	h.Set("Date", now.UTC().Format(http.TimeFormat))
	og.writeLimitHeaders(h, d.view, now)
	switch d.outcome {
	case Forbidden:
		p := problem{Code: "forbidden", Message: "access denied"}
		if d.reason == ReasonBanned {
			p = problem{Code: "banned", Reason: d.reason, Message: "this caller is blocked for sending requests while told to wait; retry after the delay given"}
		}
		writeProblem(w, http.StatusForbidden, d, p)
		return
	case RateLimited:
		if d.reason == ReasonBanned || d.reason == ReasonPenalty {
			writeProblem(w, http.StatusTooManyRequests, d, problem{
				Code: "rate_limited", Reason: d.reason,
				Message: "this caller is penalized for sending requests while told to wait; retry after the delay given",
			})
			return
		}
		writeProblem(w, http.StatusTooManyRequests, d, problem{
			Code: "rate_limited", Reason: d.reason,
			Message: "this caller's request quota is exhausted; retry after the delay given",
		})
		return
	case CapacityExhausted:
		msg := "shared capacity is exhausted; retry later"
		if d.reason == ReasonStoreDown {
			msg = "the rate limiter is unavailable; request refused"
		}
		writeProblem(w, http.StatusServiceUnavailable, d, problem{Code: "capacity_exhausted", Reason: d.reason, Message: msg})
		return
	}
	if !tokenOK {
		h.Set("WWW-Authenticate", `Bearer error="invalid_token"`)
		writeJSON(w, http.StatusUnauthorized, problem{Code: "invalid_token", Message: "unknown or malformed bearer token"})
		return
	}
	og.serveObject(s, w, r, f)
}

// tarpit holds the answer for d on the origin's clock, the caller's
// connection open; false when the request ended meanwhile.
func (og *Origin) tarpit(r *http.Request, d time.Duration) bool {
	t := og.clk.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C():
		return true
	case <-r.Context().Done():
		return false
	}
}

func writeProblem(w http.ResponseWriter, status int, d decision, p problem) {
	if d.retryAfter != "" {
		w.Header().Set("Retry-After", d.retryAfter)
		if secs, err := strconv.ParseInt(d.retryAfter, 10, 64); err == nil {
			p.RetryAfterSeconds = &secs
		}
	}
	writeJSON(w, status, p)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, _ := json.Marshal(v)
	b = append(b, '\n')
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	w.Write(b)
}

// writeLimitHeaders writes the profile's rate-limit header family from the
// caller's own buckets; nothing when the store is down.
func (og *Origin) writeLimitHeaders(h http.Header, v *limitView, now time.Time) {
	if v == nil {
		return
	}
	switch og.profile.headers() {
	case HeadersIETF:
		q := v.quota
		burstW := ceilSeconds(time.Duration(q.burst.capacity) * q.burst.interval)
		pol := `"burst";q=` + strconv.FormatInt(q.burst.capacity, 10) + `;w=` + strconv.FormatInt(max(burstW, 1), 10) +
			`, "sustained";q=` + strconv.FormatInt(q.sustained.capacity, 10) + `;w=` + strconv.FormatInt(max(ceilSeconds(q.window), 1), 10)
		if v.share > 0 {
			pol += `, "` + policyShare + `";q=` + strconv.FormatInt(v.share, 10) + `;w=` + strconv.FormatInt(max(ceilSeconds(v.shareWindow), 1), 10)
		}
		h.Set("RateLimit-Policy", pol)
		hv := v.header()
		h.Set("RateLimit", `"`+hv.policy+`";r=`+strconv.FormatInt(hv.remaining, 10)+`;t=`+strconv.FormatInt(hv.reset, 10))
	case HeadersXRateLimit:
		hv := v.header()
		h.Set("X-RateLimit-Limit", strconv.FormatInt(hv.limit, 10))
		h.Set("X-RateLimit-Remaining", strconv.FormatInt(hv.remaining, 10))
		reset := hv.reset
		if og.profile.XRateLimitReset == "epoch" {
			reset = now.Add(time.Duration(hv.reset)*time.Second).Unix() + boolInt(now.Nanosecond() > 0)
		}
		h.Set("X-RateLimit-Reset", strconv.FormatInt(reset, 10))
	}
}

func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// ETag returns the strong ETag of the object at path with size bytes.
func ETag(path string, size int64) string {
	sum := objectSeed(path, size)
	return `"` + hex.EncodeToString(sum[:16]) + `"`
}

// ObjectBytes returns the bytes served for path and size; tests and the
// load test use it to check what was stored.
func ObjectBytes(path string, size int64) []byte {
	b := make([]byte, size)
	newObjectReader(path, size).Read(b)
	return b
}

func objectSeed(path string, size int64) [32]byte {
	h := sha256.New()
	h.Write([]byte("stuborigin object v1\x00"))
	h.Write([]byte(path))
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(size))
	h.Write(n[:])
	var s [32]byte
	copy(s[:], h.Sum(nil))
	return s
}

// newObjectReader streams the object's bytes: ChaCha8 keyed by the path and
// size, so a byte never depends on how the body is chunked.
func newObjectReader(path string, size int64) io.Reader {
	return io.LimitReader(rand.NewChaCha8(objectSeed(path, size)), size)
}

func (og *Origin) serveObject(s *shard, w http.ResponseWriter, r *http.Request, f *Faults) {
	h := w.Header()
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		h.Set("Allow", "GET, HEAD")
		writeJSON(w, http.StatusMethodNotAllowed, problem{Code: "method_not_allowed", Message: "only GET and HEAD"})
		return
	}
	size := og.profile.defaultSize()
	if v := r.URL.Query().Get("size"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 || n > og.profile.maxSize() {
			writeJSON(w, http.StatusBadRequest, problem{Code: "invalid_size", Message: "size must be an integer between 0 and " + strconv.FormatInt(og.profile.maxSize(), 10)})
			return
		}
		size = n
	}
	etag := ETag(r.URL.Path, size)
	h.Set("ETag", etag)
	h.Set("Last-Modified", lastModified.Format(http.TimeFormat))
	if notModified(r, etag) {
		w.WriteHeader(http.StatusNotModified)
		return
	}
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Content-Length", strconv.FormatInt(size, 10))
	fault := f.pick(s.index, s.served.Add(1))
	if fault == faultReset {
		resetConn(w)
		return
	}
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		return
	}
	body := newObjectReader(r.URL.Path, size)
	switch fault {
	case faultTruncate:
		io.CopyN(w, body, size/2)
		http.NewResponseController(w).Flush()
		// The server closes the connection without finishing the body.
		panic(http.ErrAbortHandler)
	case faultSlow:
		og.slowCopy(w, r, body, f.slowRate())
	default:
		io.Copy(w, body)
	}
}

// slowCopy sends body at rate bytes per second in tenths of a second,
// waiting on the origin's clock; it stops when the request ends.
func (og *Origin) slowCopy(w http.ResponseWriter, r *http.Request, body io.Reader, rate int64) {
	chunk := max(rate/10, 1)
	rc := http.NewResponseController(w)
	t := og.clk.NewTimer(100 * time.Millisecond)
	defer t.Stop()
	for {
		n, err := io.CopyN(w, body, chunk)
		if n == 0 || err != nil {
			return
		}
		rc.Flush()
		select {
		case <-t.C():
			t.Reset(100 * time.Millisecond)
		case <-r.Context().Done():
			return
		}
	}
}

// resetConn aborts the connection with a TCP RST (linger 0) before any
// response byte is written.
func resetConn(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	conn.Close()
}

// notModified applies If-None-Match (weak comparison, as RFC 9110 asks for
// GET) and, only without it, If-Modified-Since.
func notModified(r *http.Request, etag string) bool {
	if inm := r.Header.Get("If-None-Match"); inm != "" {
		for _, t := range strings.Split(inm, ",") {
			t = strings.TrimSpace(t)
			if t == "*" || strings.TrimPrefix(t, "W/") == etag {
				return true
			}
		}
		return false
	}
	if ims := r.Header.Get("If-Modified-Since"); ims != "" {
		if t, err := http.ParseTime(ims); err == nil && !lastModified.After(t) {
			return true
		}
	}
	return false
}
