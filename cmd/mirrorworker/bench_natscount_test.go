package main

// What a pipeline asks of its nats-server, for BenchmarkThroughput's
// process mode: the server's own /varz counts around a run, and, with
// MW_BENCH_NATS_SUBJECTS=1, a tap (a subscription to every subject on a
// connection of the benchmark's) that sorts each message by the class of
// its subject. The tap costs the server a copy of every message, so a
// round with it is for counting, not for timing.

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// benchSubjectsEnv turns the subject tap on in the process mode.
const benchSubjectsEnv = "MW_BENCH_NATS_SUBJECTS"

// natsVarz is the part of a nats-server's /varz the benchmark reads.
type natsVarz struct {
	InMsgs   int64 `json:"in_msgs"`
	OutMsgs  int64 `json:"out_msgs"`
	InBytes  int64 `json:"in_bytes"`
	OutBytes int64 `json:"out_bytes"`
}

func (v natsVarz) sub(w natsVarz) natsVarz {
	return natsVarz{v.InMsgs - w.InMsgs, v.OutMsgs - w.OutMsgs, v.InBytes - w.InBytes, v.OutBytes - w.OutBytes}
}

// readVarz reads /varz from the monitoring address mon (host:port).
func readVarz(mon string) (natsVarz, error) {
	hc := &http.Client{Timeout: 10 * time.Second}
	resp, err := hc.Get("http://" + mon + "/varz")
	if err != nil {
		return natsVarz{}, fmt.Errorf("read varz: %w", err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return natsVarz{}, fmt.Errorf("read varz: %w", err)
	}
	var v natsVarz
	if err := json.Unmarshal(data, &v); err != nil {
		return natsVarz{}, fmt.Errorf("read varz: %w", err)
	}
	return v, nil
}

// mustVarz is readVarz on the benchmark's goroutine.
func mustVarz(b testing.TB, mon string) natsVarz {
	b.Helper()
	v, err := readVarz(mon)
	if err != nil {
		b.Fatal(err)
	}
	return v
}

// subjectCount is what the tap saw of one class: messages and bytes
// (subject, reply, headers and payload, as the protocol carries them).
type subjectCount struct {
	msgs, bytes int64
}

// subjectTap counts every message of an account by the class of its
// subject. A reply (to an _INBOX) is counted under the class of the
// request that named that inbox, seen just before. Safe for concurrent
// use.
type subjectTap struct {
	mu      sync.Mutex
	inboxOf map[string]string // reply subject -> class of the request that named it
	counts  map[string]subjectCount
	sub     *nats.Subscription
}

// startSubjectTap subscribes to every subject on nc.
func startSubjectTap(b testing.TB, nc *nats.Conn) *subjectTap {
	b.Helper()
	t := &subjectTap{inboxOf: map[string]string{}, counts: map[string]subjectCount{}}
	t.sub = subscribeUnbounded(b, nc, ">", t.handle)
	return t
}

// stop unsubscribes and returns the counts by class.
func (t *subjectTap) stop() map[string]subjectCount {
	t.sub.Unsubscribe()
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.counts
}

func (t *subjectTap) handle(m *nats.Msg) {
	size := int64(len(m.Subject) + len(m.Reply) + len(m.Data))
	for k, vs := range m.Header {
		for _, v := range vs {
			size += int64(len(k) + len(v) + 4)
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	class := t.classifyLocked(m)
	c := t.counts[class]
	c.msgs++
	c.bytes += size
	t.counts[class] = c
}

// classifyLocked names m's class; t.mu is held.
func (t *subjectTap) classifyLocked(m *nats.Msg) string {
	s := m.Subject
	if strings.HasPrefix(m.Reply, "$JS.ACK.") {
		// A delivery keeps its stream subject on the wire; its reply
		// names the stream it came from.
		tok := strings.Split(m.Reply, ".")
		return "  delivery from " + tok[min(2, len(tok)-1)]
	}
	if strings.HasPrefix(s, "_INBOX.") {
		req, ok := t.inboxOf[s]
		if !ok {
			// nats.go's request mux answers on _INBOX.<mux>.<token>.
			req = "unknown request"
		}
		switch {
		case m.Header.Get("Status") == "100":
			return "  heartbeat / flow control (to " + req + ")"
		case m.Header.Get("Status") != "":
			return "  status " + m.Header.Get("Status") + " (to " + req + ")"
		}
		return "  reply (to " + req + ")"
	}
	class := subjectClass(s, string(m.Data))
	if m.Reply != "" {
		t.inboxOf[m.Reply] = class
	}
	return class
}

// subjectClass is the class of a message published on subject s: the
// JetStream API by kind, acks by kind, KV by bucket, other subjects by
// their first two tokens.
func subjectClass(s, data string) string {
	tok := strings.Split(s, ".")
	switch {
	case strings.HasPrefix(s, "$JS.API.CONSUMER.MSG.NEXT."):
		return "$JS.API.CONSUMER.MSG.NEXT (pull request)"
	case strings.HasPrefix(s, "$JS.API.DIRECT.GET."):
		return "$JS.API.DIRECT.GET." + tok[4]
	case strings.HasPrefix(s, "$JS.API.STREAM.MSG.GET."):
		return "$JS.API.STREAM.MSG.GET." + tok[5]
	case strings.HasPrefix(s, "$JS.API."):
		// $JS.API.<STREAM|CONSUMER>.<VERB>.<stream>...: the verb names
		// the kind.
		if len(tok) >= 4 {
			return "$JS.API." + tok[2] + "." + tok[3]
		}
		return s
	case strings.HasPrefix(s, "$JS.ACK."):
		kind := "+ACK"
		switch {
		case data == "" || data == "+ACK":
		case len(data) >= 4:
			kind = data[:4]
		default:
			kind = data
		}
		stream := ""
		if len(tok) >= 3 {
			stream = tok[2]
		}
		return "$JS.ACK." + stream + " " + kind
	case strings.HasPrefix(s, "$KV."):
		if len(tok) >= 2 {
			return "$KV." + tok[1] + " (put)"
		}
	case strings.HasPrefix(s, "$JS.EVENT."):
		if len(tok) >= 4 {
			return "$JS.EVENT." + tok[2] + "." + tok[3]
		}
	}
	if len(tok) >= 2 {
		return tok[0] + "." + tok[1]
	}
	return s
}

// logSubjectCounts logs counts per job of total jobs, largest first.
func logSubjectCounts(b testing.TB, side string, counts map[string]subjectCount, total int) {
	b.Helper()
	names := make([]string, 0, len(counts))
	var all subjectCount
	for k, c := range counts {
		names = append(names, k)
		all.msgs += c.msgs
		all.bytes += c.bytes
	}
	slices.SortFunc(names, func(x, y string) int { return int(counts[y].msgs - counts[x].msgs) })
	var sb strings.Builder
	fmt.Fprintf(&sb, "  %s: messages seen by the tap, per job (of %d): %.3f msgs, %.0f B\n", side, total,
		float64(all.msgs)/float64(total), float64(all.bytes)/float64(total))
	for _, k := range names {
		c := counts[k]
		fmt.Fprintf(&sb, "    %-70s %8.3f msgs/job %8.0f B/job (%d msgs)\n", k,
			float64(c.msgs)/float64(total), float64(c.bytes)/float64(total), c.msgs)
	}
	b.Log(sb.String())
}

// benchNATSProfileEnv, a directory, makes each process-mode round take a
// CPU profile of its nats-server (<dir>/<side>-nats<pid>.pprof), for
// MW_BENCH_NATS_PROFILE_SECONDS (default 5) from the pipeline's start.
const benchNATSProfileEnv = "MW_BENCH_NATS_PROFILE"

// natsProfile takes a CPU profile of the nats-server whose profiling
// endpoint is prof (host:port) into path; wait returns once it is written.
func natsProfile(b testing.TB, prof, path string, seconds int) (wait func()) {
	done := make(chan error, 1)
	go func() {
		hc := &http.Client{Timeout: time.Duration(seconds+60) * time.Second}
		resp, err := hc.Get(fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", prof, seconds))
		if err != nil {
			done <- err
			return
		}
		defer resp.Body.Close()
		data, err := io.ReadAll(resp.Body)
		if err == nil {
			err = os.WriteFile(path, data, 0o644)
		}
		done <- err
	}()
	return func() {
		if err := <-done; err != nil {
			b.Errorf("nats-server profile: %v", err)
		}
	}
}
