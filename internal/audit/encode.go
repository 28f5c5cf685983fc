package audit

import (
	"sort"
	"strconv"
	"time"
	"unicode/utf8"
)

// appendJSON encodes r as encoding/json would (same fields, order and
// omissions), without reflection: the receiver's hot path. FuzzEncode
// checks that both decode to the same value.
func (r *Record) appendJSON(b []byte) []byte {
	b = append(b, `{"time":`...)
	if r.Time == "" && !r.at.IsZero() {
		b = append(b, '"')
		b = r.at.UTC().AppendFormat(b, time.RFC3339Nano)
		b = append(b, '"')
	} else {
		b = appendString(b, r.Time)
	}
	b = append(b, `,"class_uid":`...)
	b = strconv.AppendInt(b, int64(r.ClassUID), 10)
	b = append(b, `,"class_name":`...)
	b = appendString(b, r.ClassName)
	b = append(b, `,"activity_id":`...)
	b = strconv.AppendInt(b, int64(r.ActivityID), 10)
	b = append(b, `,"activity_name":`...)
	b = appendString(b, r.ActivityName)
	if r.Status != "" {
		b = append(b, `,"status":`...)
		b = appendString(b, r.Status)
	}
	if r.Errno != 0 {
		b = append(b, `,"errno":`...)
		b = strconv.AppendInt(b, r.Errno, 10)
	}
	if r.Result != nil {
		b = append(b, `,"result":`...)
		b = strconv.AppendInt(b, *r.Result, 10)
	}
	if p := r.Process; p != nil {
		b = append(b, `,"process":{`...)
		start := len(b)
		b = optInt(b, start, "pid", int64(p.PID))
		b = optInt(b, start, "tid", int64(p.TID))
		b = optInt(b, start, "ppid", int64(p.PPID))
		b = optString(b, start, "name", p.Name)
		b = optStrings(b, start, "argv", p.Argv)
		b = optStrings(b, start, "env", p.Env)
		b = optString(b, start, "exe", p.Exe)
		b = optString(b, start, "cwd", p.Cwd)
		if p.UID != nil {
			b = key(b, start, "uid")
			b = strconv.AppendUint(b, uint64(*p.UID), 10)
		}
		if p.GID != nil {
			b = key(b, start, "gid")
			b = strconv.AppendUint(b, uint64(*p.GID), 10)
		}
		if p.ExitSts != nil {
			b = key(b, start, "exit_status")
			b = strconv.AppendInt(b, int64(*p.ExitSts), 10)
		}
		if p.ExitSignal != nil {
			b = key(b, start, "exit_signal")
			b = strconv.AppendInt(b, int64(*p.ExitSignal), 10)
		}
		b = optInt(b, start, "child_pid", int64(p.ChildPID))
		b = append(b, '}')
	}
	if f := r.File; f != nil {
		b = append(b, `,"file":{"path":`...)
		b = appendString(b, f.Path)
		if f.Flags != "" {
			b = append(b, `,"flags":`...)
			b = appendString(b, f.Flags)
		}
		if f.Mode != 0 {
			b = append(b, `,"mode":`...)
			b = strconv.AppendUint(b, uint64(f.Mode), 10)
		}
		b = append(b, '}')
	}
	if d := r.Dst; d != nil {
		b = append(b, `,"dst_endpoint":{`...)
		start := len(b)
		b = optString(b, start, "family", d.Family)
		b = optString(b, start, "ip", d.IP)
		b = optInt(b, start, "port", int64(d.Port))
		b = optString(b, start, "path", d.Path)
		b = optString(b, start, "type", d.Type)
		b = append(b, '}')
	}
	if r.Message != "" {
		b = append(b, `,"message":`...)
		b = appendString(b, r.Message)
	}
	b = append(b, `,"event":`...)
	b = appendString(b, r.Event)
	b = appendMap(b, "counts", r.Counts, func(b []byte, v uint64) []byte { return strconv.AppendUint(b, v, 10) })
	b = appendMap(b, "detail", r.Detail, appendString)
	b = append(b, `,"sandbox_id":`...)
	b = appendString(b, r.Sandbox)
	for _, kv := range [...][2]string{{"container_id", r.Container}, {"pod_namespace", r.PodNamespace}, {"pod_name", r.PodName}, {"role", r.Role}, {"policy_digest", r.PolicyDigest}} {
		if kv[1] != "" {
			b = append(b, ',')
			b = appendString(b, kv[0])
			b = append(b, ':')
			b = appendString(b, kv[1])
		}
	}
	b = append(b, `,"seq":`...)
	b = strconv.AppendUint(b, r.Seq, 10)
	b = append(b, `,"prev_hash":`...)
	b = appendString(b, r.PrevHash)
	return append(b, '}')
}

// appendMap appends ,"name":{...} with sorted keys, as encoding/json
// encodes a map; nothing for an empty map (omitempty).
func appendMap[V any](b []byte, name string, m map[string]V, appendValue func([]byte, V) []byte) []byte {
	if len(m) == 0 {
		return b
	}
	b = append(b, ',', '"')
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

// key starts a field of an object whose body began at start.
func key(b []byte, start int, k string) []byte {
	if len(b) > start {
		b = append(b, ',')
	}
	b = append(b, '"')
	b = append(b, k...)
	return append(b, '"', ':')
}

func optInt(b []byte, start int, k string, v int64) []byte {
	if v == 0 {
		return b
	}
	return strconv.AppendInt(key(b, start, k), v, 10)
}

func optString(b []byte, start int, k, v string) []byte {
	if v == "" {
		return b
	}
	return appendString(key(b, start, k), v)
}

func optStrings(b []byte, start int, k string, v []string) []byte {
	if len(v) == 0 {
		return b
	}
	b = append(key(b, start, k), '[')
	for i, s := range v {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, s)
	}
	return append(b, ']')
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
