package pacer

import "time"

// This file reads the IETF RateLimit fields (draft-ietf-httpapi-ratelimit-headers):
// Structured Field Lists (RFC 9651). RateLimit items name a quota policy and
// carry r (remaining, an Integer) and t (seconds until reset, an Integer);
// RateLimit-Policy items name a policy and carry q (its quota) and w (its
// window in seconds), for example
//
//	RateLimit: "default";r=0;t=30, "daily";r=412;t=80000
//	RateLimit-Policy: "default";q=100;w=60, "daily";q=5000;w=86400
//
// Earlier drafts wrote a policy as an Integer quota with a w parameter
// ("100;w=60", also in RateLimit-Limit and X-RateLimit-Limit); that form is
// read too. A field that does not parse is ignored as a whole, as RFC 9651
// requires.

// sfItem is one top-level item of a list: its bare item when it is a String,
// a Token or an Integer, and the integer parameters the pacer reads.
type sfItem struct {
	name       string // a String (unescaped only if it has no escapes) or Token bare item
	num        int64  // an Integer bare item
	hasNum     bool
	r, t, q, w int64
	hasR, hasT bool
	hasQ, hasW bool
}

// ietfReset returns the longest t of the items with r=0 and t>0, or 0.
func ietfReset(s string) time.Duration {
	var buf [8]sfItem
	items, ok := sfList(s, buf[:0])
	if !ok {
		return 0
	}
	var best time.Duration
	for _, it := range items {
		if it.hasR && it.hasT && it.r == 0 && it.t > 0 {
			best = max(best, time.Duration(min(it.t, maxHeaderSeconds))*time.Second)
		}
	}
	return best
}

// sfList parses s as a List and appends its items (inner lists skipped) to
// items. ok is false when s does not parse; items is then unusable.
func sfList(s string, items []sfItem) ([]sfItem, bool) {
	p := sfParser{s: s}
	return p.list(items)
}

type sfParser struct {
	s string
	i int
}

func (p *sfParser) eof() bool { return p.i >= len(p.s) }

func (p *sfParser) skipSP() {
	for p.i < len(p.s) && p.s[p.i] == ' ' {
		p.i++
	}
}

func (p *sfParser) skipOWS() {
	for p.i < len(p.s) && (p.s[p.i] == ' ' || p.s[p.i] == '\t') {
		p.i++
	}
}

// list parses the whole field.
func (p *sfParser) list(items []sfItem) ([]sfItem, bool) {
	p.skipSP()
	for !p.eof() {
		if p.s[p.i] == '(' {
			if !p.innerList() {
				return items, false
			}
			if !p.params(nil) {
				return items, false
			}
		} else {
			var it sfItem
			v, isInt, name, ok := p.bareItem()
			if !ok {
				return items, false
			}
			it.num, it.hasNum, it.name = v, isInt, name
			if !p.params(&it) {
				return items, false
			}
			items = append(items, it)
		}
		p.skipOWS()
		if p.eof() {
			return items, true
		}
		if p.s[p.i] != ',' {
			return items, false
		}
		p.i++
		p.skipOWS()
		if p.eof() {
			return items, false // trailing comma
		}
	}
	return items, true
}

func (p *sfParser) innerList() bool {
	p.i++ // '('
	for !p.eof() {
		p.skipSP()
		if p.eof() {
			return false
		}
		if p.s[p.i] == ')' {
			p.i++
			return true
		}
		if _, _, _, ok := p.bareItem(); !ok {
			return false
		}
		if !p.params(nil) {
			return false
		}
		if p.eof() {
			return false
		}
		if c := p.s[p.i]; c != ' ' && c != ')' {
			return false
		}
	}
	return false
}

// params parses parameters; the non-negative Integer values of the keys r,
// t, q and w are recorded in it when it is not nil (the last one wins).
func (p *sfParser) params(it *sfItem) bool {
	for !p.eof() && p.s[p.i] == ';' {
		p.i++
		p.skipSP()
		start := p.i
		if !p.key() {
			return false
		}
		k := p.s[start:p.i]
		var v int64
		isInt := false
		if !p.eof() && p.s[p.i] == '=' {
			p.i++
			var ok bool
			v, isInt, _, ok = p.bareItem()
			if !ok {
				return false
			}
		}
		if it == nil || len(k) != 1 {
			continue
		}
		good := isInt && v >= 0
		switch k[0] {
		case 'r':
			it.r, it.hasR = v, good
		case 't':
			it.t, it.hasT = v, good
		case 'q':
			it.q, it.hasQ = v, good
		case 'w':
			it.w, it.hasW = v, good
		}
	}
	return true
}

func (p *sfParser) key() bool {
	if p.eof() {
		return false
	}
	c := p.s[p.i]
	if !(c >= 'a' && c <= 'z' || c == '*') {
		return false
	}
	p.i++
	for !p.eof() {
		c = p.s[p.i]
		if c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.' || c == '*' {
			p.i++
			continue
		}
		break
	}
	return true
}

// bareItem parses one bare item; for an Integer it returns its value and
// isInt true, for a String or a Token its text (a String's text still
// escaped, which only matters for names with a quote or a backslash).
func (p *sfParser) bareItem() (v int64, isInt bool, name string, ok bool) {
	if p.eof() {
		return 0, false, "", false
	}
	switch c := p.s[p.i]; {
	case c == '-' || c >= '0' && c <= '9':
		v, isInt, ok = p.number()
		return v, isInt, "", ok
	case c == '"':
		start := p.i + 1
		if !p.str() {
			return 0, false, "", false
		}
		return 0, false, p.s[start : p.i-1], true
	case c == '*' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z':
		start := p.i
		p.token()
		return 0, false, p.s[start:p.i], true
	case c == ':':
		return 0, false, "", p.bytes()
	case c == '?':
		if p.i+1 < len(p.s) && (p.s[p.i+1] == '0' || p.s[p.i+1] == '1') {
			p.i += 2
			return 0, false, "", true
		}
		return 0, false, "", false
	case c == '@': // Date: an Integer after '@'
		p.i++
		if p.eof() {
			return 0, false, "", false
		}
		_, isInt, ok := p.number()
		return 0, false, "", ok && isInt
	}
	return 0, false, "", false
}

func (p *sfParser) number() (int64, bool, bool) {
	neg := false
	if p.s[p.i] == '-' {
		neg = true
		p.i++
	}
	var v int64
	n, dot, fracDigits := 0, false, 0
	for !p.eof() {
		c := p.s[p.i]
		if c >= '0' && c <= '9' {
			if dot {
				fracDigits++
			} else {
				v = v*10 + int64(c-'0')
			}
			n++
			p.i++
			if !dot && n > 15 || dot && (n > 16 || fracDigits > 3) {
				return 0, false, false
			}
			continue
		}
		if c == '.' && !dot {
			if n == 0 || n > 12 {
				return 0, false, false
			}
			dot = true
			p.i++
			continue
		}
		break
	}
	if n == 0 || dot && fracDigits == 0 {
		return 0, false, false
	}
	if neg {
		v = -v
	}
	return v, !dot, true
}

func (p *sfParser) str() bool {
	p.i++ // '"'
	for !p.eof() {
		c := p.s[p.i]
		p.i++
		switch {
		case c == '\\':
			if p.eof() || p.s[p.i] != '"' && p.s[p.i] != '\\' {
				return false
			}
			p.i++
		case c == '"':
			return true
		case c < 0x20 || c > 0x7e:
			return false
		}
	}
	return false
}

func (p *sfParser) token() {
	p.i++
	for !p.eof() {
		c := p.s[p.i]
		if isTchar(c) || c == ':' || c == '/' {
			p.i++
			continue
		}
		return
	}
}

func isTchar(c byte) bool {
	if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' {
		return true
	}
	switch c {
	case '!', '#', '$', '%', '&', '\'', '*', '+', '-', '.', '^', '_', '`', '|', '~':
		return true
	}
	return false
}

func (p *sfParser) bytes() bool {
	p.i++ // ':'
	for !p.eof() {
		c := p.s[p.i]
		p.i++
		if c == ':' {
			return true
		}
		if !(c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '+' || c == '/' || c == '=') {
			return false
		}
	}
	return false
}
