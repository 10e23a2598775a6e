package broker

import (
	"net/url"
	"strings"
)

// RedactURL drops userinfo from each comma-separated NATS URL so that
// credentials never reach an error message or a log line. A URL that does
// not parse is replaced whole, since it might still hold a password.
func RedactURL(s string) string {
	parts := strings.Split(s, ",")
	for i, p := range parts {
		u, err := url.Parse(strings.TrimSpace(p))
		if err != nil {
			parts[i] = "<unparseable url>"
			continue
		}
		if u.User != nil {
			u.User = url.User("redacted")
		}
		parts[i] = u.String()
	}
	return strings.Join(parts, ",")
}
