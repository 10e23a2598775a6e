package broker

import (
	"net/url"
	"strings"
)

// redactURL drops userinfo from each comma-separated NATS URL so that
// credentials never reach an error message or a log line.
func redactURL(s string) string {
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
