// Package credentials loads the per-authority credentials the worker sends
// to private upstreams (a bearer token, basic user and password, a fixed
// header, an mTLS client certificate and key, a CA bundle for the origin)
// from a file or a directory (a Kubernetes Secret mounted read-only), and
// reloads them when the files change, keeping the last good set when a
// change does not parse.
//
// It hands each authority's credential to the fetch client as a
// *fetch.Credential. It never logs, formats or returns a secret's bytes:
// errors name the file and the entry, never a value. It knows nothing of
// jobs, NATS or the pacer. The format is docs/adr/0020-credentials-and-egress-proxies.md.
package credentials

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/mirrorworker/mirrorworker/authority"
	"github.com/mirrorworker/mirrorworker/fetch"
)

// File is the JSON of one credentials file.
type File struct {
	// Authorities maps "host:port" (or "*.domain:port", every subdomain of
	// domain at any depth, not domain itself) to its credential.
	Authorities map[string]Entry `json:"authorities"`
}

// Entry is one authority's credential: at most one of Bearer, Basic and
// Header, and optionally a client certificate and key (mTLS) and a CA
// bundle. Every *_file path is relative to the directory of the file that
// names it, unless absolute.
type Entry struct {
	Bearer     string  `json:"bearer,omitempty"`
	BearerFile string  `json:"bearer_file,omitempty"`
	Basic      *Basic  `json:"basic,omitempty"`
	Header     *Header `json:"header,omitempty"`
	ClientCert string  `json:"client_cert_file,omitempty"`
	ClientKey  string  `json:"client_key_file,omitempty"`
	CA         string  `json:"ca_file,omitempty"`
}

// Basic is HTTP basic authentication.
type Basic struct {
	Username     string `json:"username"`
	Password     string `json:"password,omitempty"`
	PasswordFile string `json:"password_file,omitempty"`
}

// Header is a fixed request header, e.g. X-Api-Key.
type Header struct {
	Name      string `json:"name"`
	Value     string `json:"value,omitempty"`
	ValueFile string `json:"value_file,omitempty"`
}

// forbiddenHeaders are headers a credential may not set: they frame the
// request, belong to the transport, or are the worker's own.
var forbiddenHeaders = map[string]bool{
	"Host": true, "Content-Length": true, "Transfer-Encoding": true, "Connection": true,
	"Keep-Alive": true, "Te": true, "Trailer": true, "Upgrade": true, "Proxy-Authorization": true,
	"Proxy-Connection": true, "User-Agent": true, "If-None-Match": true, "If-Modified-Since": true,
	"Range": true,
}

// Set is a loaded credential set: immutable, safe for concurrent use.
type Set struct {
	exact map[authority.Authority]*entry
	wild  []*entry // longest suffix first
	n     int
}

type entry struct {
	pattern string // as written: "host:port" or "*.domain:port"
	suffix  string // wildcard: ".domain"
	port    string
	digest  [32]byte // of the resolved material, to tell a changed entry; never shown
	cred    *fetch.Credential
}

// Len is the number of entries.
func (s *Set) Len() int {
	if s == nil {
		return 0
	}
	return s.n
}

// Patterns returns the entries' authorities as written, sorted: what a log
// line may say about the set.
func (s *Set) Patterns() []string {
	if s == nil {
		return nil
	}
	var out []string
	for _, e := range s.exact {
		out = append(out, e.pattern)
	}
	for _, e := range s.wild {
		out = append(out, e.pattern)
	}
	sort.Strings(out)
	return out
}

// Credential returns a's credential, or nil: an exact entry wins over a
// wildcard, and a longer wildcard over a shorter one.
func (s *Set) Credential(a authority.Authority) *fetch.Credential {
	if e := s.lookup(a); e != nil {
		return e.cred
	}
	return nil
}

func (s *Set) lookup(a authority.Authority) *entry {
	if s == nil {
		return nil
	}
	if e := s.exact[a]; e != nil {
		return e
	}
	host := strings.ToLower(a.Host)
	for _, e := range s.wild {
		if e.port == a.Port && strings.HasSuffix(host, e.suffix) && len(host) > len(e.suffix) {
			return e
		}
	}
	return nil
}

// Load reads path: a credentials file, or a directory whose *.json files
// (names starting with "." are skipped, as Kubernetes' ..data links are)
// together make the set. An authority named twice is an error. A
// directory without any *.json file is an empty set.
func Load(path string) (*Set, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("credentials: %w", err)
	}
	var files []string
	if fi.IsDir() {
		des, err := os.ReadDir(path)
		if err != nil {
			return nil, fmt.Errorf("credentials: %w", err)
		}
		for _, de := range des {
			if strings.HasPrefix(de.Name(), ".") || !strings.HasSuffix(de.Name(), ".json") {
				continue
			}
			files = append(files, filepath.Join(path, de.Name()))
		}
	} else {
		files = []string{path}
	}
	s := &Set{exact: map[authority.Authority]*entry{}}
	seen := map[string]string{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("credentials: %w", err)
		}
		var cf File
		dec := json.NewDecoder(strings.NewReader(string(data)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&cf); err != nil {
			return nil, fmt.Errorf("credentials: %s: %s", f, jsonError(err))
		}
		for pat, e := range cf.Authorities {
			en, err := build(filepath.Dir(f), pat, e)
			if err != nil {
				return nil, fmt.Errorf("credentials: %s: %q: %w", f, pat, err)
			}
			if prev, dup := seen[en.pattern]; dup {
				return nil, fmt.Errorf("credentials: %s: %q is also in %s", f, pat, prev)
			}
			seen[en.pattern] = f
			s.n++
			if en.suffix == "" {
				a, _ := hostPort(en.pattern)
				s.exact[a] = en
			} else {
				s.wild = append(s.wild, en)
			}
		}
	}
	sort.Slice(s.wild, func(i, j int) bool {
		if len(s.wild[i].suffix) != len(s.wild[j].suffix) {
			return len(s.wild[i].suffix) > len(s.wild[j].suffix)
		}
		return s.wild[i].pattern < s.wild[j].pattern
	})
	return s, nil
}

// jsonError describes a decoding error without quoting the input: a
// syntax error's offset, a type error's field. Neither carries a value.
func jsonError(err error) string {
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &se):
		return fmt.Sprintf("invalid JSON at byte %d", se.Offset)
	case errors.As(err, &te):
		return fmt.Sprintf("field %q: want %s", te.Field, te.Type)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		return strings.TrimPrefix(err.Error(), "json: ") // the field's name, from our own schema
	}
	return "invalid JSON"
}

// build checks one entry and resolves its files into a fetch.Credential.
func build(dir, pat string, e Entry) (*entry, error) {
	en := &entry{}
	p := strings.ToLower(strings.TrimSpace(pat))
	if rest, ok := strings.CutPrefix(p, "*."); ok {
		host, port, err := net.SplitHostPort(rest)
		if err != nil || port == "" {
			return nil, errors.New("want host:port or *.domain:port, with the port")
		}
		if strings.Count(host, ".") < 1 || strings.ContainsAny(host, "*[]") {
			return nil, errors.New("a wildcard needs a domain of two labels or more (*.example.org:443)")
		}
		a, err := hostPort(host + ":" + port)
		if err != nil {
			return nil, err
		}
		en.suffix, en.port, en.pattern = "."+a.Host, a.Port, "*."+a.String()
	} else {
		a, err := hostPort(p)
		if err != nil {
			return nil, err
		}
		en.pattern = a.String()
	}
	read := func(what, inline, file string) (string, error) {
		if inline != "" && file != "" {
			return "", fmt.Errorf("%s: give the value or its file, not both", what)
		}
		if file == "" {
			return inline, nil
		}
		b, err := os.ReadFile(resolve(dir, file))
		if err != nil {
			return "", fmt.Errorf("%s: %w", what, err)
		}
		return strings.TrimRight(string(b), "\r\n"), nil
	}
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00", en.pattern)
	cred := &fetch.Credential{Authority: en.pattern}
	kinds := 0
	if e.Bearer != "" || e.BearerFile != "" {
		kinds++
		tok, err := read("bearer", e.Bearer, e.BearerFile)
		if err != nil {
			return nil, err
		}
		if err := headerValue(tok); err != nil {
			return nil, fmt.Errorf("bearer: %w", err)
		}
		cred.Header = http.Header{"Authorization": {"Bearer " + tok}}
	}
	if e.Basic != nil {
		kinds++
		if e.Basic.Username == "" || strings.Contains(e.Basic.Username, ":") {
			return nil, errors.New("basic: want a username without ':'")
		}
		pw, err := read("basic password", e.Basic.Password, e.Basic.PasswordFile)
		if err != nil {
			return nil, err
		}
		cred.Header = http.Header{"Authorization": {"Basic " + base64.StdEncoding.EncodeToString([]byte(e.Basic.Username+":"+pw))}}
	}
	if e.Header != nil {
		kinds++
		name := http.CanonicalHeaderKey(strings.TrimSpace(e.Header.Name))
		if !validToken(name) || forbiddenHeaders[name] {
			return nil, fmt.Errorf("header: name %q is not allowed", e.Header.Name)
		}
		v, err := read("header value", e.Header.Value, e.Header.ValueFile)
		if err != nil {
			return nil, err
		}
		if err := headerValue(v); err != nil {
			return nil, fmt.Errorf("header value: %w", err)
		}
		cred.Header = http.Header{name: {v}}
	}
	if kinds > 1 {
		return nil, errors.New("give one of bearer, basic and header")
	}
	for k, vs := range cred.Header {
		fmt.Fprintf(h, "h %s=%s\x00", k, vs[0])
	}
	var tc *tls.Config
	if (e.ClientCert == "") != (e.ClientKey == "") {
		return nil, errors.New("client_cert_file and client_key_file go together")
	}
	if e.ClientCert != "" {
		certPEM, err := os.ReadFile(resolve(dir, e.ClientCert))
		if err != nil {
			return nil, fmt.Errorf("client cert: %w", err)
		}
		keyPEM, err := os.ReadFile(resolve(dir, e.ClientKey))
		if err != nil {
			return nil, fmt.Errorf("client key: %w", err)
		}
		pair, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			// X509KeyPair's errors describe the PEM blocks, not their bytes.
			return nil, fmt.Errorf("client cert and key: %w", err)
		}
		tc = &tls.Config{Certificates: []tls.Certificate{pair}}
		fmt.Fprintf(h, "c %x\x00k %x\x00", sha256.Sum256(certPEM), sha256.Sum256(keyPEM))
	}
	if e.CA != "" {
		caPEM, err := os.ReadFile(resolve(dir, e.CA))
		if err != nil {
			return nil, fmt.Errorf("ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(caPEM) {
			return nil, errors.New("ca: no PEM certificate in the file")
		}
		if tc == nil {
			tc = &tls.Config{}
		}
		tc.RootCAs = pool
		fmt.Fprintf(h, "a %x\x00", sha256.Sum256(caPEM))
	}
	if kinds == 0 && tc == nil {
		return nil, errors.New("empty: give bearer, basic, header, a client certificate or a CA")
	}
	if tc != nil {
		tc.MinVersion = tls.VersionTLS12
		cred.TLS = tc
	}
	copy(en.digest[:], h.Sum(nil))
	en.cred = cred
	return en, nil
}

// hostPort parses "host:port" (the port required) as an authority.
func hostPort(s string) (authority.Authority, error) {
	if _, port, err := net.SplitHostPort(s); err != nil || port == "" {
		return authority.Authority{}, errors.New("want host:port or *.domain:port, with the port")
	}
	a, err := authority.FromURL(&url.URL{Scheme: "https", Host: s})
	if err != nil {
		return authority.Authority{}, fmt.Errorf("authority: %w", err)
	}
	return a, nil
}

func resolve(dir, file string) string {
	if filepath.IsAbs(file) {
		return file
	}
	return filepath.Join(dir, file)
}

// headerValue refuses what would break a request line: an empty value,
// control characters (a newline would inject headers).
func headerValue(v string) error {
	if v == "" {
		return errors.New("empty")
	}
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < 0x20 && c != '\t' || c == 0x7f {
			return fmt.Errorf("control character at byte %d", i)
		}
	}
	return nil
}

func validToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}
