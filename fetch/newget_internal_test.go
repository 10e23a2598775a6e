package fetch

import (
	"context"
	"net/http"
	"net/url"
	"testing"
)

// TestNewGetIsNewRequestWithoutTheReparse: newGet gives the request
// http.NewRequestWithContext gives for u.String(), field by field, for
// URLs whose printing and parsing do something (an empty port, escapes,
// userinfo, a query, IPv6), and never changes u.
func TestNewGetIsNewRequestWithoutTheReparse(t *testing.T) {
	for _, tc := range []struct {
		name, url string
	}{
		{"plain", "http://example.org/a/b"},
		{"empty port", "http://example.org:/a"},
		{"ipv6 with empty port", "http://[2001:db8::1]:/a"},
		{"ipv6 with port", "https://[2001:db8::1]:8443/a"},
		{"escaped path", "http://example.org/a%2Fb/c%20d"},
		{"space in path", "http://example.org/a b"},
		{"query", "http://example.org/a?x=1&y=%20#frag"},
		{"userinfo", "http://user:p%40ss@example.org:8080/a"},
		{"no path", "http://example.org"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u, err := url.Parse(tc.url)
			if err != nil {
				t.Fatal(err)
			}
			before := *u
			ctx := context.WithValue(context.Background(), struct{}{}, 1)
			want, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
			if err != nil {
				t.Fatal(err)
			}
			got, err := newGet(ctx, u)
			if err != nil {
				t.Fatal(err)
			}
			if *u != before {
				t.Errorf("u changed: %+v, was %+v", *u, before)
			}
			if got.URL == u {
				t.Error("the request shares u")
			}
			// The URL as net/http reads it: its printing, the request line,
			// the dialled host and the credentials. A RawPath that does not
			// encode Path ("/a b" before it is printed) is not compared:
			// EscapedPath ignores it.
			for _, f := range []struct{ name, got, want string }{
				{"Method", got.Method, want.Method},
				{"Host", got.Host, want.Host},
				{"Proto", got.Proto, want.Proto},
				{"URL", got.URL.String(), want.URL.String()},
				{"URL.Host", got.URL.Host, want.URL.Host},
				{"URL.Scheme", got.URL.Scheme, want.URL.Scheme},
				{"URL.Path", got.URL.Path, want.URL.Path},
				{"URL.EscapedPath", got.URL.EscapedPath(), want.URL.EscapedPath()},
				{"URL.RawQuery", got.URL.RawQuery, want.URL.RawQuery},
				{"URL.User", got.URL.User.String(), want.URL.User.String()},
				{"RequestURI", got.URL.RequestURI(), want.URL.RequestURI()},
			} {
				if f.got != f.want {
					t.Errorf("%s %q, want %q", f.name, f.got, f.want)
				}
			}
			if got.ProtoMajor != 1 || got.ProtoMinor != 1 || got.Body != nil || got.ContentLength != 0 || len(got.Header) != 0 || got.Header == nil {
				t.Errorf("request %+v", got)
			}
			if got.Context() != ctx {
				t.Error("not the given context")
			}
		})
	}
}
