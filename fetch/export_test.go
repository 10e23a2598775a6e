package fetch

import (
	"net/netip"
	"slices"
)

// NewTreatingAsPublic returns a Client that judges the given addresses as
// if they were public, so a loopback test origin can stand for the
// internet while every other address is judged by the real policy.
func NewTreatingAsPublic(o *Options, public ...netip.Addr) *Client {
	c := New(o)
	real := c.check
	c.check = func(a netip.Addr) string {
		if slices.Contains(public, a.WithZone("").Unmap()) {
			return ""
		}
		return real(a)
	}
	return c
}
