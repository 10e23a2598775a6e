package credentials_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/mirrorworker/mirrorworker/authority"
	"github.com/mirrorworker/mirrorworker/credentials"
	"github.com/mirrorworker/mirrorworker/fetch/fetchtest"
)

func write(t *testing.T, dir, name, data string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

func auth(host, port string) authority.Authority { return authority.Authority{Host: host, Port: port} }

func TestLoadAndMatch(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "a.json", `{"authorities": {
		"Files.Example.org:443": {"bearer": "t1"},
		"*.example.org:443": {"header": {"name": "X-Api-Key", "value_file": "key"}},
		"*.cdn.example.org:443": {"basic": {"username": "u", "password": "p"}}
	}}`)
	write(t, dir, "key", "k1\n")
	write(t, dir, "..data", "ignored") // Kubernetes' links
	write(t, dir, "notes.txt", "not json, not read")
	set, err := credentials.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		a    authority.Authority
		name string
		want string
	}{
		{auth("files.example.org", "443"), "Authorization", "Bearer t1"},    // exact wins
		{auth("a.example.org", "443"), "X-Api-Key", "k1"},                   // wildcard, file value trimmed
		{auth("x.y.example.org", "443"), "X-Api-Key", "k1"},                 // any depth
		{auth("img.cdn.example.org", "443"), "Authorization", "Basic dTpw"}, // longer wildcard wins
		{auth("example.org", "443"), "", ""},                                // not the apex
		{auth("a.example.org", "8443"), "", ""},                             // another port
		{auth("badexample.org", "443"), "", ""},                             // a suffix is not a subdomain
	}
	for _, tt := range tests {
		c := set.Credential(tt.a)
		if tt.name == "" {
			if c != nil {
				t.Errorf("%s: got a credential %+v, want none", tt.a, c.Header)
			}
			continue
		}
		if c == nil || c.Header.Get(tt.name) != tt.want {
			t.Errorf("%s: %v, want %s: %s", tt.a, c, tt.name, tt.want)
		}
	}
	if got := strings.Join(set.Patterns(), " "); got != "*.cdn.example.org:443 *.example.org:443 files.example.org:443" {
		t.Errorf("Patterns = %s", got)
	}
	empty := t.TempDir()
	if s, err := credentials.Load(empty); err != nil || s.Len() != 0 {
		t.Errorf("empty directory: %v, %d entries; want an empty set", err, s.Len())
	}
}

// TestLoadErrors: mistakes are named by file and entry, and never quote a
// secret.
func TestLoadErrors(t *testing.T) {
	const secret = "s3cr3t-Do-Not-Print"
	ca, err := fetchtest.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	cert, _, _ := ca.Issue("c")
	tests := []struct {
		name, json, want string
	}{
		{"syntax", `{"authorities": {"a.example:443": {"bearer": "` + secret + `"}`, "invalid JSON"},
		{"type", `{"authorities": {"a.example:443": {"bearer": ["` + secret + `"]}}}`, "want string"},
		{"unknown field", `{"authorities": {"a.example:443": {"token": "` + secret + `"}}}`, `unknown field "token"`},
		{"no port", `{"authorities": {"a.example": {"bearer": "` + secret + `"}}}`, "with the port"},
		{"wide wildcard", `{"authorities": {"*.org:443": {"bearer": "` + secret + `"}}}`, "two labels"},
		{"two kinds", `{"authorities": {"a.example:443": {"bearer": "` + secret + `", "header": {"name": "X-K", "value": "v"}}}}`, "one of"},
		{"bad header", `{"authorities": {"a.example:443": {"header": {"name": "Host", "value": "` + secret + `"}}}}`, "not allowed"},
		{"newline", `{"authorities": {"a.example:443": {"bearer": "` + secret + `\nX-Evil: 1"}}}`, "control character"},
		{"empty", `{"authorities": {"a.example:443": {}}}`, "empty"},
		{"missing file", `{"authorities": {"a.example:443": {"bearer_file": "nope"}}}`, "no such file"},
		{"cert without key", `{"authorities": {"a.example:443": {"client_cert_file": "c.pem"}}}`, "go together"},
		{"bad key", `{"authorities": {"a.example:443": {"client_cert_file": "c.pem", "client_key_file": "k.pem"}}}`, "client cert and key"},
		{"bad ca", `{"authorities": {"a.example:443": {"ca_file": "k.pem"}}}`, "no PEM certificate"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			write(t, dir, "c.pem", string(cert))
			write(t, dir, "k.pem", "-----BEGIN EC PRIVATE KEY-----\n"+secret+"\n-----END EC PRIVATE KEY-----\n")
			write(t, dir, "creds.json", tt.json)
			_, err := credentials.Load(filepath.Join(dir, "creds.json"))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Load = %v, want an error with %q", err, tt.want)
			}
			if strings.Contains(err.Error(), secret) || !strings.Contains(err.Error(), "creds.json") {
				t.Errorf("error quotes the secret or does not name the file: %v", err)
			}
		})
	}
	dir := t.TempDir()
	write(t, dir, "a.json", `{"authorities": {"a.example:443": {"bearer": "x"}}}`)
	write(t, dir, "b.json", `{"authorities": {"A.example:443": {"bearer": "y"}}}`)
	if _, err := credentials.Load(dir); err == nil || !strings.Contains(err.Error(), "also in") {
		t.Errorf("an authority in two files: %v", err)
	}
}

// TestStoreReload: a change is picked up and versioned, an unchanged
// entry keeps its version and pointer, a file that does not parse keeps
// the last good set and says so, once, and OnChange names what changed.
func TestStoreReload(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "c.json", `{"authorities": {"a.example:443": {"bearer": "one"}, "b.example:443": {"bearer": "bee"}}}`)
	var logs bytes.Buffer
	s, err := credentials.Open(dir, &credentials.Options{Logger: zerolog.New(&logs)})
	if err != nil {
		t.Fatal(err)
	}
	a, b := auth("a.example", "443"), auth("b.example", "443")
	ca0, cb0 := s.Credential(a), s.Credential(b)
	if ca0 == nil || ca0.Version == 0 || cb0 == nil || ca0.Version == cb0.Version {
		t.Fatalf("versions %v %v: want distinct, non-zero", ca0, cb0)
	}
	var changed []func(authority.Authority) bool
	s.OnChange(func(m func(authority.Authority) bool) { changed = append(changed, m) })

	if err := s.Reload(); err != nil || len(changed) != 0 || s.Credential(a) != ca0 {
		t.Fatalf("a reload of unchanged files: %v, %d changes, same pointer %v", err, len(changed), s.Credential(a) == ca0)
	}
	write(t, dir, "c.json", `{"authorities": {"a.example:443": {"bearer": "two"}, "b.example:443": {"bearer": "bee"}, "c.example:443": {"bearer": "see"}}}`)
	if err := s.Reload(); err != nil {
		t.Fatal(err)
	}
	ca1 := s.Credential(a)
	if ca1.Header.Get("Authorization") != "Bearer two" || ca1.Version <= ca0.Version || s.Credential(b) != cb0 {
		t.Errorf("after the change: a %v (was version %d), b changed %v", ca1, ca0.Version, s.Credential(b) != cb0)
	}
	if len(changed) != 1 || !changed[0](a) || changed[0](b) || !changed[0](auth("c.example", "443")) {
		t.Errorf("OnChange: %d calls, or the wrong authorities", len(changed))
	}

	write(t, dir, "c.json", `{"authorities": {"a.example:443": {"bearer": "three"`) // a half-written file
	for range 3 {
		if err := s.Reload(); err == nil {
			t.Fatal("a broken file reloaded")
		}
	}
	if s.Credential(a) != ca1 {
		t.Error("a broken file replaced the last good set")
	}
	if n := strings.Count(logs.String(), "keeping the last good set"); n != 1 {
		t.Errorf("the broken file was logged %d times, want once:\n%s", n, logs.String())
	}
	write(t, dir, "c.json", `{"authorities": {"a.example:443": {"bearer": "three"}}}`)
	if err := s.Reload(); err != nil || s.Credential(a).Header.Get("Authorization") != "Bearer three" || s.Credential(b) != nil {
		t.Errorf("the fixed file: %v", err)
	}
	for _, secret := range []string{"one", "two", "three", "bee", "see"} {
		if strings.Contains(logs.String(), `"`+secret) || strings.Contains(logs.String(), "Bearer") {
			t.Errorf("the log names a secret (%s):\n%s", secret, logs.String())
		}
	}
}
