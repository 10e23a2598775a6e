package worker

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/mirrorworker/mirrorworker/fetch"
	"github.com/mirrorworker/mirrorworker/jobs"
)

// contractList returns the codes in backticks of the bullet of
// docs/contract.md that starts with title, up to the next bullet.
func contractList(t *testing.T, title string) []string {
	t.Helper()
	b, err := os.ReadFile("../docs/contract.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	i := strings.Index(text, "- "+title+":")
	if i < 0 {
		t.Fatalf("docs/contract.md has no bullet %q", title)
	}
	rest := text[i+2:]
	if j := regexp.MustCompile(`\n\s*- `).FindStringIndex(rest); j != nil {
		rest = rest[:j[0]]
	}
	if j := strings.Index(rest, "\n\n"); j >= 0 {
		rest = rest[:j]
	}
	var codes []string
	for _, m := range regexp.MustCompile("`([a-z_<>0-9]+)`").FindAllStringSubmatch(rest, -1) {
		codes = append(codes, m[1])
	}
	return codes
}

// sameSet compares two lists as sets and says what is missing on each side.
func sameSet(t *testing.T, what string, documented, code []string) {
	t.Helper()
	for _, c := range code {
		if !slices.Contains(documented, c) {
			t.Errorf("%s: %q is in the code but not in docs/contract.md", what, c)
		}
	}
	for _, d := range documented {
		if !slices.Contains(code, d) {
			t.Errorf("%s: %q is in docs/contract.md but not in the code", what, d)
		}
	}
}

// TestContractListsTheDeferralReasons holds the contract's list of
// deferral reasons against the constants of route.go.
func TestContractListsTheDeferralReasons(t *testing.T) {
	var code []string
	for _, r := range append(slices.Clone(pacerReasons), reasonOverflow, reasonHandover, reasonHandoff, reasonAuthHold, reasonRegrouped, reasonDeleteLimit, reasonSameBytes) {
		code = append(code, string(r))
	}
	for _, r := range pacerReasons {
		code = append(code, redirectPrefix+string(r))
	}
	var documented []string
	for _, c := range contractList(t, "Deferral reasons (the `reason` of the `job deferred` and `job parked` log lines; a\n    deferral costs no budget)") {
		if c != "reason" && c != "job deferred" && c != "job parked" && c != redirectPrefix {
			documented = append(documented, c)
		}
	}
	sameSet(t, "deferral reasons", documented, code)
}

// transportCodes are fetch.ReasonCode's codes of failed transfers, got by
// asking it (its codes are strings in one switch of package fetch).
func transportCodes() []string {
	var codes []string
	for _, err := range []error{
		fetch.ErrTruncated, fetch.ErrTooSlow, fetch.ErrRangeMismatch, fetch.ErrInvalidURL, fetch.ErrIdleTimeout, context.Canceled,
		&net.DNSError{Err: "no such host"}, &net.OpError{Op: "dial", Err: errors.New("connection refused")},
		fmt.Errorf("handshake: %w", tls.AlertError(40)),
	} {
		if c := fetch.ReasonCode(err, 0); !slices.Contains(codes, c) {
			codes = append(codes, c)
		}
	}
	return codes
}

// TestContractListsTheRetryAndDeadLetterReasons holds the contract's lists
// against jobs' reason constants and fetch.ReasonCode.
func TestContractListsTheRetryAndDeadLetterReasons(t *testing.T) {
	httpCode := strings.TrimSuffix(jobs.HTTPReason(0), "0") + "<status>"
	dead := []string{
		jobs.ReasonInvalidJob, jobs.ReasonUnsupportedVersion, jobs.ReasonBudgetExhausted, jobs.ReasonDestinationRefused,
		jobs.ReasonTooManyRedirects, jobs.ReasonBodyTooLarge, jobs.ReasonContentMismatch, jobs.ReasonInvalidTarget,
		jobs.ReasonTargetConflict, jobs.ReasonDeleteUnsupported, fetch.ReasonCode(fetch.ErrInvalidURL, 0), httpCode,
	}
	// fetch's permanent errors name the jobs' reasons.
	for _, err := range []error{&fetch.RefusedError{}, fetch.ErrTooManyRedirects, fetch.ErrBodyTooLarge} {
		if c := fetch.ReasonCode(err, 0); !slices.Contains(dead, c) {
			t.Errorf("fetch.ReasonCode(%v) = %q, no dead-letter reason of jobs", err, c)
		}
	}
	var documentedDead []string
	for _, c := range contractList(t, "Dead-letter reasons") {
		if c != jobs.HTTPReason(404) { // the example of http_<status>
			documentedDead = append(documentedDead, c)
		}
	}
	sameSet(t, "dead-letter reasons", documentedDead, dead)

	retry := []string{jobs.ReasonSizeMismatch, jobs.ReasonDigestMismatch, jobs.ReasonTargetWrite, httpCode,
		strings.TrimSuffix(jobs.ThrottledReason(0), "0") + "<status>"}
	for _, c := range transportCodes() {
		if c != fetch.ReasonCode(fetch.ErrInvalidURL, 0) { // permanent: a dead-letter reason
			retry = append(retry, c)
		}
	}
	var documented []string
	for _, c := range contractList(t, "Retry reasons (a failed attempt, counted against the budget; the last one is named in\n    `budget_exhausted`'s detail)") {
		if c != "budget_exhausted" && c != "http_503" && c != "throttled_429" {
			documented = append(documented, c)
		}
	}
	sameSet(t, "retry reasons", documented, retry)
}
