// Package fetchtest has origins for tests of fetching: real HTTP handlers
// that misbehave in the ways the fetch client must survive. For tests only.
package fetchtest

import (
	"net/http"
	"time"
)

// Trickle answers with a Content-Length of 1,000,000 and then sends one
// byte per tick, until the client goes away or stop is closed (close it
// before the server, so that the server's Close does not wait for the
// handler).
func Trickle(tick time.Duration, stop <-chan struct{}) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "1000000")
		w.WriteHeader(http.StatusOK)
		t := time.NewTicker(tick)
		defer t.Stop()
		for range 1000000 {
			if _, err := w.Write([]byte("x")); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				return
			case <-stop:
				return
			case <-t.C:
			}
		}
	}
}
