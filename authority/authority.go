// Package authority derives the politeness key of a request: the lowercase
// ASCII host (IDNA to punycode, IPv6 in brackets) and the port, with the
// scheme's default port filled in.
//
// Two URLs with the same Authority are paced together; anything else about the
// URL (path, query, scheme once the port is known) does not matter. The package
// does no DNS resolution and no destination policy: see package fetch for that.
package authority

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"

	"golang.org/x/net/idna"
)

// Authority is a normalised host and port. The zero value is not a valid
// authority. Authority values are comparable and safe to use as map keys.
type Authority struct {
	// Host is lowercase ASCII: a punycode domain name, a dotted IPv4 address,
	// or an IPv6 address without brackets.
	Host string
	// Port is the decimal port, never empty.
	Port string
}

// ErrInvalid is wrapped by every error this package returns.
var ErrInvalid = errors.New("invalid authority")

// profile is the IDNA profile used for lookups: it maps case and width,
// validates, and converts to punycode, as a browser does for a URL host.
var profile = idna.New(
	idna.MapForLookup(),
	idna.BidiRule(),
	idna.Transitional(false),
)

// Parse derives the authority of an absolute http or https URL.
func Parse(rawURL string) (Authority, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return Authority{}, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	return FromURL(u)
}

// FromURL derives the authority of an absolute http or https URL.
func FromURL(u *url.URL) (Authority, error) {
	var defPort string
	switch strings.ToLower(u.Scheme) {
	case "http":
		defPort = "80"
	case "https":
		defPort = "443"
	default:
		return Authority{}, fmt.Errorf("%w: scheme %q is not http or https", ErrInvalid, u.Scheme)
	}
	host := u.Hostname()
	port := u.Port()
	if host == "" {
		return Authority{}, fmt.Errorf("%w: empty host", ErrInvalid)
	}
	if port == "" {
		if strings.HasSuffix(u.Host, ":") {
			return Authority{}, fmt.Errorf("%w: empty port", ErrInvalid)
		}
		port = defPort
	}
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil || n == 0 {
		return Authority{}, fmt.Errorf("%w: port %q", ErrInvalid, port)
	}
	port = strconv.FormatUint(n, 10)
	h, err := normalizeHost(host)
	if err != nil {
		return Authority{}, err
	}
	return Authority{Host: h, Port: port}, nil
}

func normalizeHost(host string) (string, error) {
	if strings.Contains(host, ":") { // IPv6 literal (brackets already removed by url)
		// Zones are meaningless off the local machine and would make two
		// spellings of one origin pace separately.
		if strings.Contains(host, "%") {
			return "", fmt.Errorf("%w: IPv6 zone in host %q", ErrInvalid, host)
		}
		a, err := netip.ParseAddr(host)
		if err != nil || !a.Is6() {
			return "", fmt.Errorf("%w: host %q", ErrInvalid, host)
		}
		return a.String(), nil
	}
	if a, err := netip.ParseAddr(host); err == nil {
		return a.String(), nil
	}
	h := strings.TrimSuffix(host, ".")
	ascii, err := profile.ToASCII(h)
	if err != nil || ascii == "" {
		return "", fmt.Errorf("%w: host %q: %v", ErrInvalid, host, err)
	}
	for _, r := range ascii {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '.' || r == '_') {
			return "", fmt.Errorf("%w: host %q has character %q", ErrInvalid, host, r)
		}
	}
	return ascii, nil
}

// String returns "host:port", with an IPv6 host in brackets.
func (a Authority) String() string {
	return net.JoinHostPort(a.Host, a.Port)
}

// Key returns the subject-safe form of the authority used in NATS subjects
// (mirror.jobs.<tenant>.<akey>): String with '.', ':', '[' and ']' replaced
// by '_'. For example "files.example.org:443" becomes "files_example_org_443".
func (a Authority) Key() string {
	return KeyOf(a.String())
}

// KeyOf returns the subject-safe key of an authority string "host:port".
func KeyOf(s string) string {
	return keyReplacer.Replace(s)
}

var keyReplacer = strings.NewReplacer(".", "_", ":", "_", "[", "_", "]", "_")

// Split splits an authority string "host:port" (as String gives it) into
// its host, without IPv6 brackets, and port; a string without a port gives
// (s, ""). It is for labels and log fields, never for validation (Parse
// validates).
func Split(s string) (host, port string) {
	h, p, err := net.SplitHostPort(s)
	if err != nil {
		return s, ""
	}
	return h, p
}

// StripUserinfo returns rawURL without the userinfo (credentials) of its
// authority, for anything stored or shown; rawURL unchanged when it has
// none, and "" when it does not parse (its credentials could not be found).
func StripUserinfo(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		return ""
	}
	if u.User == nil {
		return rawURL
	}
	u.User = nil
	return u.String()
}

// IsZero reports whether a is the zero Authority.
func (a Authority) IsZero() bool { return a.Host == "" && a.Port == "" }
