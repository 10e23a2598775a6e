package fetch_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"

	"github.com/mirrorworker/mirrorworker/authority"
	"github.com/mirrorworker/mirrorworker/fetch"
)

func ExampleClient_Do() {
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/old" {
			http.Redirect(w, r, "/new", http.StatusMovedPermanently)
			return
		}
		w.Header().Set("ETag", `"v1"`)
		io.WriteString(w, "hello")
	}))
	defer origin.Close()

	// The test origin is on loopback, which only AllowPrivate admits.
	c := fetch.New(&fetch.Options{AllowPrivate: true})
	gate := func(ctx context.Context, hop int, a authority.Authority) (func(fetch.Result), error) {
		// A pacer would decide here whether this hop may start now.
		return func(r fetch.Result) { fmt.Println("hop", hop, "answered", r.Status) }, nil
	}
	resp, err := c.Do(context.Background(), fetch.Request{URL: origin.URL + "/old"}, gate)
	if err != nil {
		fmt.Println(fetch.ReasonCode(err, 0), err)
		return
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	fmt.Println(fetch.Classify(resp.Status), resp.Hops, resp.Header.Get("ETag"), string(body), err)
	// Output:
	// hop 0 answered 301
	// hop 1 answered 200
	// success 2 "v1" hello <nil>
}
