package authority_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/mirrorworker/mirrorworker/authority"
)

func TestParse(t *testing.T) {
	tests := []struct {
		name    string
		url     string
		want    string
		wantKey string
		wantErr bool
	}{
		{name: "https default port", url: "https://Files.Example.org/a", want: "files.example.org:443", wantKey: "files_example_org_443"},
		{name: "explicit default port", url: "https://files.example.org:443/b", want: "files.example.org:443"},
		{name: "other port", url: "https://files.example.org:8443/b", want: "files.example.org:8443", wantKey: "files_example_org_8443"},
		{name: "http default", url: "http://example.com", want: "example.com:80"},
		{name: "scheme case", url: "HTTP://EXAMPLE.com/", want: "example.com:80"},
		{name: "trailing dot", url: "http://example.com./x", want: "example.com:80"},
		{name: "leading zero port", url: "http://example.com:0080/", want: "example.com:80"},
		{name: "idna", url: "https://Bücher.example/x", want: "xn--bcher-kva.example:443", wantKey: "xn--bcher-kva_example_443"},
		{name: "ipv4", url: "http://127.0.0.1:8080/", want: "127.0.0.1:8080", wantKey: "127_0_0_1_8080"},
		{name: "ipv6", url: "http://[::1]:8080/", want: "[::1]:8080", wantKey: "___1__8080"},
		{name: "ipv6 normalised", url: "https://[2001:DB8:0:0::1]/", want: "[2001:db8::1]:443"},
		{name: "ftp refused", url: "ftp://example.com/", wantErr: true},
		{name: "no host", url: "http:///path", wantErr: true},
		{name: "relative", url: "/just/a/path", wantErr: true},
		{name: "port zero", url: "http://example.com:0/", wantErr: true},
		{name: "port too big", url: "http://example.com:65536/", wantErr: true},
		{name: "empty port", url: "http://example.com:/", wantErr: true},
		{name: "bad host char", url: "http://exa mple.com/", wantErr: true},
		{name: "ipv6 zone", url: "http://[fe80::1%25eth0]/", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, err := authority.Parse(tt.url)
			if tt.wantErr {
				if err == nil {
					t.Fatalf("Parse(%q) = %v, want error", tt.url, a)
				}
				if !errors.Is(err, authority.ErrInvalid) {
					t.Fatalf("error %v does not wrap ErrInvalid", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Parse(%q): %v", tt.url, err)
			}
			if got := a.String(); got != tt.want {
				t.Errorf("String() = %q, want %q", got, tt.want)
			}
			if tt.wantKey != "" && a.Key() != tt.wantKey {
				t.Errorf("Key() = %q, want %q", a.Key(), tt.wantKey)
			}
		})
	}
}

func ExampleAuthority_Key() {
	a, _ := authority.Parse("https://Files.Example.org/pkg.tar.gz")
	fmt.Println(a.String(), a.Key())
	// Output: files.example.org:443 files_example_org_443
}

func TestSplit(t *testing.T) {
	for _, tt := range []struct{ in, host, port string }{
		{"files.example.org:443", "files.example.org", "443"},
		{"[2001:db8::1]:8443", "2001:db8::1", "8443"},
		{"no-port", "no-port", ""},
	} {
		if h, p := authority.Split(tt.in); h != tt.host || p != tt.port {
			t.Errorf("Split(%q) = %q, %q; want %q, %q", tt.in, h, p, tt.host, tt.port)
		}
	}
}

func TestStripUserinfo(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"https://user:secret@files.example.org/a?x=1", "https://files.example.org/a?x=1"},
		{"https://files.example.org/a%20b", "https://files.example.org/a%20b"},
		{"https://user@[2001:db8::1]:8443/", "https://[2001:db8::1]:8443/"},
		{"http://user:secret@bad host/", ""}, // does not parse: nothing to show
	} {
		if got := authority.StripUserinfo(tt.in); got != tt.want {
			t.Errorf("StripUserinfo(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}
