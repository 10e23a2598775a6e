package pacer

import "time"

// This file reads the IETF RateLimit field (draft-ietf-httpapi-ratelimit-headers):
// a Structured Field List (RFC 9651) whose items name a quota policy and carry
// the parameters r (remaining, an Integer) and t (seconds until reset, an
// Integer), for example
//
//	RateLimit: "default";r=0;t=30, "daily";r=412;t=80000
//
// A field that does not parse is ignored as a whole, as RFC 9651 requires.
// RateLimit-Policy describes quotas (q, w) but says nothing about what
// remains, so it never causes a pause and is not read.

// ietfReset returns the longest t of the items with r=0 and t>0, or 0.
func ietfReset(s string) time.Duration {
	p := sfParser{s: s}
	best, ok := p.list()
	if !ok {
		return 0
	}
	return best
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

// list parses the whole field and returns the longest exhausted reset.
func (p *sfParser) list() (time.Duration, bool) {
	var best time.Duration
	p.skipSP()
	for !p.eof() {
		var r, t int64
		var hasR, hasT bool
		if p.s[p.i] == '(' {
			if !p.innerList() {
				return 0, false
			}
			if !p.params(nil, nil, nil, nil) {
				return 0, false
			}
		} else {
			if _, _, ok := p.bareItem(); !ok {
				return 0, false
			}
			if !p.params(&r, &hasR, &t, &hasT) {
				return 0, false
			}
		}
		if hasR && hasT && r == 0 && t > 0 {
			d := time.Duration(min(t, maxHeaderSeconds)) * time.Second
			best = max(best, d)
		}
		p.skipOWS()
		if p.eof() {
			return best, true
		}
		if p.s[p.i] != ',' {
			return 0, false
		}
		p.i++
		p.skipOWS()
		if p.eof() {
			return 0, false // trailing comma
		}
	}
	return best, true
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
		if _, _, ok := p.bareItem(); !ok {
			return false
		}
		if !p.params(nil, nil, nil, nil) {
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

// params parses parameters; the integer values of keys "r" and "t" are
// reported through the pointers when they are not nil (the last one wins).
func (p *sfParser) params(r *int64, hasR *bool, t *int64, hasT *bool) bool {
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
			v, isInt, ok = p.bareItem()
			if !ok {
				return false
			}
		}
		switch {
		case k == "r" && r != nil:
			*r, *hasR = v, isInt && v >= 0
		case k == "t" && t != nil:
			*t, *hasT = v, isInt && v >= 0
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
// isInt true.
func (p *sfParser) bareItem() (v int64, isInt bool, ok bool) {
	if p.eof() {
		return 0, false, false
	}
	switch c := p.s[p.i]; {
	case c == '-' || c >= '0' && c <= '9':
		return p.number()
	case c == '"':
		return 0, false, p.str()
	case c == '*' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z':
		p.token()
		return 0, false, true
	case c == ':':
		return 0, false, p.bytes()
	case c == '?':
		if p.i+1 < len(p.s) && (p.s[p.i+1] == '0' || p.s[p.i+1] == '1') {
			p.i += 2
			return 0, false, true
		}
		return 0, false, false
	case c == '@': // Date: an Integer after '@'
		p.i++
		if p.eof() {
			return 0, false, false
		}
		_, isInt, ok := p.number()
		return 0, false, ok && isInt
	}
	return 0, false, false
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
