package audit

// A small JSON writer for the OCSF encoder: no reflection, no allocation
// per field, strings escaped as encoding/json does.

import (
	"sort"
	"strconv"
	"unicode/utf8"
)

// enc writes one JSON object field by field; a field is preceded by a
// comma unless it opens its object or array.
type enc struct{ b []byte }

func (e *enc) key(k string) {
	if c := e.b[len(e.b)-1]; c != '{' && c != '[' {
		e.b = append(e.b, ',')
	}
	e.b = append(e.b, '"')
	e.b = append(e.b, k...)
	e.b = append(e.b, '"', ':')
}

func (e *enc) open(k string) { e.key(k); e.b = append(e.b, '{') }

func (e *enc) openArr(k string) {
	e.key(k)
	e.b = append(e.b, '[')
}

func (e *enc) close() { e.b = append(e.b, '}') }

func (e *enc) int(k string, v int64) {
	e.key(k)
	e.b = strconv.AppendInt(e.b, v, 10)
}

func (e *enc) optInt(k string, v int64) {
	if v != 0 {
		e.int(k, v)
	}
}

func (e *enc) str(k, v string) {
	e.key(k)
	e.b = appendString(e.b, v)
}

func (e *enc) strs(k string, v []string) {
	e.openArr(k)
	for i, s := range v {
		if i > 0 {
			e.b = append(e.b, ',')
		}
		e.b = appendString(e.b, s)
	}
	e.b = append(e.b, ']')
}

func (e *enc) optStr(k, v string) {
	if v != "" {
		e.str(k, v)
	}
}

// appendMap appends ,"name":{...} with sorted keys, as encoding/json
// encodes a map; nothing for an empty map (omitempty).
func appendMap[V any](b []byte, name string, m map[string]V, appendValue func([]byte, V) []byte) []byte {
	if len(m) == 0 {
		return b
	}
	if b[len(b)-1] != '{' {
		b = append(b, ',')
	}
	b = append(b, '"')
	b = append(b, name...)
	b = append(b, '"', ':', '{')
	for i, k := range sortedKeys(m) {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, k)
		b = append(b, ':')
		b = appendValue(b, m[k])
	}
	return append(b, '}')
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

const hexDigits = "0123456789abcdef"

// plainASCII marks the ASCII bytes a JSON string carries as they are.
var plainASCII = func() (t [utf8.RuneSelf]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\' && c != '<' && c != '>' && c != '&'
	}
	return t
}()

// appendString appends s as a JSON string, as encoding/json does: control
// characters, quotes and backslashes escaped, <, > and & as \u00XX,
// invalid UTF-8 as U+FFFD, U+2028 and U+2029 escaped.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if plainASCII[c] {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// AppendJSONString appends s as a JSON string, escaped as encoding/json
// does (the forwarders build their payloads with it).
func AppendJSONString(b []byte, s string) []byte { return appendString(b, s) }
