//go:build e2e

package worker_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/fetch"
	"github.com/mirrorworker/mirrorworker/fetch/fetchtest"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/worker"
)

// nameResolver resolves nothing but the metadata trap, as a pod whose
// DNS does not know the origins the proxy reaches.
type nameResolver map[string]netip.Addr

func (m nameResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if a, ok := m[host]; ok {
		return []netip.Addr{a}, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

// TestWorkerThroughProxy: every request goes through a forward proxy on
// loopback (HTTP forwarded, HTTPS over CONNECT) to origins only the proxy
// can resolve; politeness is judged at the origins behind it: no gap below
// the floor, and no request before a 429's Retry-After (while the other
// origins behind the same proxy go on); jobs for a metadata address, by
// address, by name and by a name resolving to it, are dead-lettered
// destination_refused before the proxy is asked.
func TestWorkerThroughProxy(t *testing.T) {
	const (
		floor = 150 * time.Millisecond
		n     = 6
	)
	e := newEnv(t, 30*time.Second)
	a, b := newOrigin(t), newOrigin(t)
	var throttledAt time.Time
	var tmu sync.Mutex
	b.setBehave(func(w http.ResponseWriter, r *http.Request, _ int) bool {
		tmu.Lock()
		defer tmu.Unlock()
		if throttledAt.IsZero() {
			throttledAt = time.Now()
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
			return true
		}
		return false
	})
	ca, err := fetchtest.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	stc, err := ca.ServerTLS(false, "c.test")
	if err != nil {
		t.Fatal(err)
	}
	tlsOrigin := &origin{perPath: map[string]int{}}
	tlsOrigin.srv = httptest.NewUnstartedServer(http.HandlerFunc(tlsOrigin.serve))
	tlsOrigin.srv.TLS = stc
	tlsOrigin.srv.StartTLS()
	t.Cleanup(tlsOrigin.srv.Close)
	tlsOrigin.auth = tlsOrigin.srv.Listener.Addr().String()

	px := fetchtest.NewProxy(map[string]string{"a.test:80": a.auth, "b.test:80": b.auth, "c.test:443": tlsOrigin.auth}, "")
	t.Cleanup(px.Close)
	fc := fetch.New(&fetch.Options{
		Proxy:     fetch.Proxy{HTTPProxy: px.URL, HTTPSProxy: px.URL},
		Resolver:  nameResolver{"trap.test": netip.MustParseAddr("169.254.169.254")},
		TLSConfig: &tls.Config{RootCAs: ca.Pool},
	})

	var js []jobs.Job
	for i := range n {
		js = append(js,
			jobs.Job{ID: fmt.Sprintf("a-%d", i), URL: fmt.Sprintf("http://a.test/o/%d", i), Target: fmt.Sprintf("a/%d", i)},
			jobs.Job{ID: fmt.Sprintf("b-%d", i), URL: fmt.Sprintf("http://b.test/o/%d", i), Target: fmt.Sprintf("b/%d", i)},
			jobs.Job{ID: fmt.Sprintf("c-%d", i), URL: fmt.Sprintf("https://c.test/o/%d", i), Target: fmt.Sprintf("c/%d", i)})
	}
	refused := []jobs.Job{
		{ID: "meta-ip", URL: "http://169.254.169.254/latest/meta-data/iam/", Target: "m/1"},
		{ID: "meta-name", URL: "http://metadata.google.internal/computeMetadata/v1/", Target: "m/2"},
		{ID: "meta-resolved", URL: "http://trap.test/latest/meta-data/", Target: "m/3"},
	}
	e.publish(append(js, refused...)...)
	r := e.startWith(testPacer(floor, 1, nil, 0, nil), worker.Options{Concurrency: 8}, fc, e.target)
	e.waitReady(r.w)
	r.f.waitFor(t, 3*n, isOutcome(worker.OutcomeStored), 90*time.Second)
	r.f.waitFor(t, len(refused), isOutcome(worker.OutcomeDeadLettered), 30*time.Second)

	for _, d := range e.deadLetters() {
		if d.Reason != jobs.ReasonDestinationRefused || !strings.HasPrefix(d.JobID, "meta-") {
			t.Errorf("dead letter %s: %s, want a metadata job refused", d.JobID, d.Reason)
		}
	}
	reqs := px.Requests()
	for _, h := range []string{"169.254.169.254", "metadata.google.internal", "trap.test"} {
		if fetchtest.HasHost(reqs, h) {
			t.Errorf("the proxy was asked for %s", h)
		}
	}
	var forwarded, connects int
	for _, q := range reqs {
		switch {
		case q.Method == http.MethodConnect && q.Authority == "c.test:443":
			connects++
		case q.Method == http.MethodGet && (q.Authority == "a.test:80" || q.Authority == "b.test:80"):
			forwarded++
		default:
			t.Errorf("the proxy was asked %+v", q)
		}
	}
	// Every origin request went through the proxy: the origins saw no
	// other client than it.
	if got, want := forwarded, len(a.log())+len(b.log()); got != want {
		t.Errorf("the proxy forwarded %d requests, the origins saw %d", got, want)
	}
	t.Logf("proxy: %d forwarded, %d CONNECT tunnels for %d HTTPS requests", forwarded, connects, len(tlsOrigin.log()))
	if connects < 1 || connects > 2 {
		t.Errorf("%d CONNECTs for %d HTTPS requests one at a time: the tunnel is not reused", connects, len(tlsOrigin.log()))
	}

	checkFloor(t, "a behind the proxy", a.log(), floor)
	checkFloor(t, "b behind the proxy", b.log(), floor)
	checkFloor(t, "c behind the proxy", tlsOrigin.log(), floor)
	tmu.Lock()
	at := throttledAt
	tmu.Unlock()
	early := 0
	for _, x := range b.log() {
		if x.status != http.StatusTooManyRequests && x.at.Before(at.Add(time.Second)) {
			early++
		}
	}
	if early != 0 {
		t.Errorf("%d requests reached b before its Retry-After ran out", early)
	}
	// The cooldown was b's alone: a kept going meanwhile.
	during := 0
	for _, x := range a.log() {
		if x.at.After(at) && x.at.Before(at.Add(time.Second)) {
			during++
		}
	}
	if during == 0 {
		t.Errorf("no request reached a during b's cooldown: the politeness key is not the origin's")
	}
	for i := range n {
		e.checkStored(fmt.Sprintf("c/%d", i), body(fmt.Sprintf("/o/%d", i)))
	}
}
