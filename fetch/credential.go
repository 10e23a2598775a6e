package fetch

import (
	"crypto/tls"
	"net/http"
	"sync"

	"github.com/mirrorworker/mirrorworker/authority"
)

// Credential is what every request to one authority carries: headers (an
// Authorization, or a fixed header such as X-Api-Key) and TLS material (a
// client certificate, a CA bundle for that origin). It is immutable once
// handed out; a changed credential is a new *Credential.
type Credential struct {
	// Authority is the entry it comes from ("host:port" or a wildcard), for
	// the client's cache of TLS transports; never a secret.
	Authority string
	// Version changes whenever the credential's material changes: the
	// worker tells an authentication failure with the old material from
	// one with the new (Response.CredentialVersion).
	Version uint64
	// Header is set on the request, over any job header of the same name.
	Header http.Header
	// TLS, if set, holds Certificates and/or RootCAs for this authority;
	// its connections have a pool of their own.
	TLS *tls.Config
}

// CredentialSource gives the credential of an authority, or nil; it is
// asked once per hop, so a redirect to another authority gets that
// authority's credential or none, never the first one's.
// *credentials.Store is one. It must be safe for concurrent use.
type CredentialSource interface {
	Credential(a authority.Authority) *Credential
}

// tlsClients caches one HTTP client (and pool) per credential with TLS
// material, keyed by its entry: a new version replaces the old client,
// whose idle connections are closed. Safe for concurrent use.
type tlsClients struct {
	mu sync.Mutex
	m  map[string]tlsClient
}

type tlsClient struct {
	cred *Credential
	hc   *http.Client
}

// get returns the client of cred, made by mk when cred is new.
func (t *tlsClients) get(cred *Credential, mk func(*tls.Config) *http.Client) *http.Client {
	t.mu.Lock()
	defer t.mu.Unlock()
	if c, ok := t.m[cred.Authority]; ok && c.cred == cred {
		return c.hc
	}
	if old, ok := t.m[cred.Authority]; ok {
		old.hc.CloseIdleConnections() // in-flight requests finish on theirs
	}
	if t.m == nil {
		t.m = map[string]tlsClient{}
	}
	hc := mk(cred.TLS)
	t.m[cred.Authority] = tlsClient{cred: cred, hc: hc}
	return hc
}

func (t *tlsClients) closeIdle() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, c := range t.m {
		c.hc.CloseIdleConnections()
	}
}
