// Package bytesize reads and writes sizes in bytes and rates in bytes per
// second as people type them: "16GiB", "500MB", "1500", "1MiB/s". It is
// the one parser of the command-line size flags, the policy file's and
// MIRROR_POLICY's bandwidth caps.
//
// It provides Parse, Format, ParseRate and FormatRate; it knows nothing of
// what the numbers limit.
package bytesize

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// ErrSyntax is wrapped by every parse error.
var ErrSyntax = errors.New("bytesize: invalid size")

var units = map[string]int64{
	"": 1, "B": 1,
	"KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12,
	"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40,
}

// Parse reads a number of bytes: a non-negative integer, alone or with a
// unit (B; KB, MB, GB, TB in powers of 1000; KiB, MiB, GiB, TiB in powers
// of 1024), spaces allowed around and between.
func Parse(s string) (int64, error) {
	s = strings.TrimSpace(s)
	num := strings.TrimRightFunc(s, func(r rune) bool { return r < '0' || r > '9' })
	unit := strings.TrimSpace(s[len(num):])
	mult, ok := units[unit]
	if !ok {
		return 0, fmt.Errorf("%w: unit %q: want B, KB, MB, GB, TB, KiB, MiB, GiB or TiB", ErrSyntax, unit)
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%w: %q: want a number of bytes, e.g. 16GiB", ErrSyntax, s)
	}
	if n > 0 && n > (1<<63-1)/mult {
		return 0, fmt.Errorf("%w: %q: too large", ErrSyntax, s)
	}
	return n * mult, nil
}

// Format writes n with the largest binary unit that divides it exactly
// (16GiB, 1500), so that help and errors read as people write sizes;
// Parse reads it back.
func Format(n int64) string {
	for _, u := range []struct {
		name string
		mult int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n != 0 && n%u.mult == 0 {
			return strconv.FormatInt(n/u.mult, 10) + u.name
		}
	}
	return strconv.FormatInt(n, 10)
}

// ParseRate reads bytes per second: a size as Parse reads it, with or
// without "/s" ("1MiB/s", "500KB/s", "1048576").
func ParseRate(s string) (int64, error) {
	t := strings.TrimSpace(s)
	t = strings.TrimSpace(strings.TrimSuffix(t, "/s"))
	n, err := Parse(t)
	if err != nil {
		return 0, fmt.Errorf("%w (a rate is bytes per second: 1MiB/s, 500KB/s or a plain number)", err)
	}
	return n, nil
}

// FormatRate writes bytes per second as "1MiB/s" (Format with "/s");
// ParseRate reads it back.
func FormatRate(n int64) string { return Format(n) + "/s" }

// Approx writes n rounded to one decimal of the largest binary unit not
// above it ("512 B", "1.5 KiB", "120.3 MiB"): a size for people to read
// at a glance (progress, status), not to parse back.
func Approx(n int64) string {
	f := float64(n)
	for _, u := range []struct {
		name string
		mult float64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if f >= u.mult {
			return strconv.FormatFloat(f/u.mult, 'f', 1, 64) + " " + u.name
		}
	}
	return strconv.FormatInt(n, 10) + " B"
}
