package fetch

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"net/http"
	"strconv"
)

// Classify says how a final status affects the job. 206 is permanent: a
// partial body must never be stored as the object. The one 206 that is
// not, the rest of a body resumed (Request.From), the client checks and
// reports as Response.Offset; its caller stores it after the bytes it kept.
func Classify(status int) Class {
	switch {
	case status == http.StatusNotModified:
		return ClassNotModified
	case status == http.StatusPartialContent:
		return ClassPermanent
	case status >= 200 && status <= 299:
		return ClassSuccess
	case status == http.StatusTooManyRequests:
		return ClassThrottled
	case status == http.StatusUnauthorized, status == http.StatusForbidden:
		return ClassAuthFailed
	case status == http.StatusRequestTimeout, status >= 500 && status <= 599:
		return ClassTransient
	}
	return ClassPermanent
}

// String returns the class's lowercase name.
func (c Class) String() string {
	switch c {
	case ClassSuccess:
		return "success"
	case ClassNotModified:
		return "not_modified"
	case ClassThrottled:
		return "throttled"
	case ClassTransient:
		return "transient"
	case ClassPermanent:
		return "permanent"
	case ClassAuthFailed:
		return "auth_failed"
	}
	return "class_" + strconv.Itoa(int(c))
}

// IsPermanent reports whether a Do or Body error will recur on retry:
// a refused destination, too many redirects, an oversized body or an
// invalid URL. Everything else from this package is worth retrying.
func IsPermanent(err error) bool {
	var re *RefusedError
	return errors.As(err, &re) ||
		errors.Is(err, ErrTooManyRedirects) ||
		errors.Is(err, ErrBodyTooLarge) ||
		errors.Is(err, ErrInvalidURL)
}

// ReasonCode returns a stable code for an outcome, for dead-letter records
// and metrics: "http_<status>" when err is nil and status is set, else one
// of "destination_refused", "too_many_redirects", "body_too_large",
// "truncated", "size_mismatch", "range_mismatch", "too_slow", "invalid_url", "timeout",
// "cancelled", "dns", "tls" or "network". It returns "" for a nil err with no status. A gate's own error
// is the caller's to name.
func ReasonCode(err error, status int) string {
	if err == nil {
		if status == 0 {
			return ""
		}
		return "http_" + strconv.Itoa(status)
	}
	var (
		refused *RefusedError
		dnsErr  *net.DNSError
		netErr  net.Error
	)
	switch {
	case errors.As(err, &refused):
		return "destination_refused"
	case errors.Is(err, ErrTooManyRedirects):
		return "too_many_redirects"
	case errors.Is(err, ErrBodyTooLarge):
		return "body_too_large"
	case errors.Is(err, ErrTruncated):
		return "truncated"
	case errors.Is(err, ErrSizeMismatch):
		return "size_mismatch"
	case errors.Is(err, ErrRangeMismatch):
		return "range_mismatch"
	case errors.Is(err, ErrTooSlow):
		return "too_slow"
	case errors.Is(err, ErrInvalidURL):
		return "invalid_url"
	case errors.Is(err, ErrIdleTimeout), errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "cancelled"
	case errors.As(err, &dnsErr):
		if dnsErr.IsTimeout {
			return "timeout"
		}
		return "dns"
	case isTLS(err):
		return "tls"
	case errors.As(err, &netErr) && netErr.Timeout():
		return "timeout"
	}
	return "network"
}

func isTLS(err error) bool {
	var (
		verify   *tls.CertificateVerificationError
		record   tls.RecordHeaderError
		alert    tls.AlertError
		hostname x509.HostnameError
		unknown  x509.UnknownAuthorityError
		invalid  x509.CertificateInvalidError
	)
	return errors.As(err, &verify) || errors.As(err, &record) || errors.As(err, &alert) ||
		errors.As(err, &hostname) || errors.As(err, &unknown) || errors.As(err, &invalid)
}
