// Package egressgw is the pod's egress gateway: every connection a host
// rule allows ends here, outside the sandbox, and the gateway decides by
// name (a TLS ClientHello's SNI, an HTTP request's Host), resolves the name
// itself and dials what it resolved, never the address the agent chose.
//
// The parsing and deciding here are pure (bytes in, decision out); Gateway
// runs them on listeners the shim opens in the pod's resolver namespace.
package egressgw

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"agentbox.dev/agentbox/internal/netpolicy"
)

// MaxHello bounds the bytes read before a decision: a ClientHello (even
// fragmented over several records) or an HTTP request head. A post-quantum
// ClientHello is about 1.8 KiB.
const MaxHello = 16 << 10

// ErrNeedMore: the bytes so far are a valid prefix; read more.
var ErrNeedMore = errors.New("incomplete ClientHello")

// Hello is what a ClientHello says about where it goes.
type Hello struct {
	// SNI is the server name, lower case, without a trailing dot ("" if
	// the hello names none).
	SNI string
	// ECH: the hello carries an encrypted ClientHello, whose inner name
	// the gateway cannot see.
	ECH bool
	// ALPN are the offered application protocols.
	ALPN []string
}

// TLS extension numbers.
const (
	extServerName = 0
	extALPN       = 16
	extECH        = 0xfe0d
)

// IsTLS reports whether b starts like a TLS handshake record.
func IsTLS(b []byte) bool { return len(b) > 0 && b[0] == 0x16 }

// ParseClientHello reads the ClientHello at the start of b, which may be
// split over several handshake records. It returns ErrNeedMore while b is
// a valid but incomplete prefix. Everything here comes from the sandbox.
func ParseClientHello(b []byte) (Hello, error) {
	// Gather the handshake message from the records.
	var hs []byte
	want := -1
	for off := 0; ; {
		if want >= 0 && len(hs) >= want {
			break
		}
		if len(b)-off < 5 {
			return Hello{}, ErrNeedMore
		}
		if b[off] != 0x16 {
			return Hello{}, fmt.Errorf("record type %#x is not a handshake", b[off])
		}
		if b[off+1] != 3 {
			return Hello{}, fmt.Errorf("record version %#x%02x is not TLS", b[off+1], b[off+2])
		}
		n := int(binary.BigEndian.Uint16(b[off+3:]))
		if n == 0 || n > 1<<14 {
			return Hello{}, fmt.Errorf("record length %d", n)
		}
		if len(b)-off-5 < n {
			if off+5+n > MaxHello {
				return Hello{}, fmt.Errorf("ClientHello over %d bytes", MaxHello)
			}
			return Hello{}, ErrNeedMore
		}
		hs = append(hs, b[off+5:off+5+n]...)
		off += 5 + n
		if want < 0 && len(hs) >= 4 {
			if hs[0] != 1 {
				return Hello{}, fmt.Errorf("handshake type %d is not a ClientHello", hs[0])
			}
			want = 4 + (int(hs[1])<<16 | int(hs[2])<<8 | int(hs[3]))
			if want > MaxHello {
				return Hello{}, fmt.Errorf("ClientHello of %d bytes is over %d", want, MaxHello)
			}
		}
	}
	return parseHelloBody(hs[4:want])
}

// parseHelloBody reads a ClientHello's fields up to its extensions.
func parseHelloBody(m []byte) (Hello, error) {
	r := reader(m)
	if !r.skip(2+32) || !r.skipVec(1) || !r.skipVec(2) || !r.skipVec(1) {
		return Hello{}, errors.New("ClientHello is truncated")
	}
	if len(r) == 0 {
		return Hello{}, nil // no extensions: no name
	}
	exts, ok := r.vec(2)
	if !ok || len(r) != 0 {
		return Hello{}, errors.New("ClientHello extensions are malformed")
	}
	var h Hello
	seen := map[uint16]bool{}
	for len(exts) > 0 {
		typ, ok1 := exts.u16()
		data, ok2 := exts.vec(2)
		if !ok1 || !ok2 {
			return Hello{}, errors.New("ClientHello extension is truncated")
		}
		if seen[typ] {
			return Hello{}, fmt.Errorf("extension %d appears twice", typ)
		}
		seen[typ] = true
		switch typ {
		case extServerName:
			name, err := serverName(data)
			if err != nil {
				return Hello{}, err
			}
			h.SNI = name
		case extALPN:
			list, ok := data.vec(2)
			if !ok || len(data) != 0 {
				return Hello{}, errors.New("ALPN extension is malformed")
			}
			for len(list) > 0 {
				p, ok := list.vec(1)
				if !ok {
					return Hello{}, errors.New("ALPN extension is malformed")
				}
				h.ALPN = append(h.ALPN, string(p))
			}
		case extECH:
			h.ECH = true
		}
	}
	return h, nil
}

// serverName reads the server_name extension: exactly one host_name.
func serverName(data reader) (string, error) {
	list, ok := data.vec(2)
	if !ok || len(data) != 0 {
		return "", errors.New("server_name extension is malformed")
	}
	var name string
	for len(list) > 0 {
		if len(list) < 1 {
			return "", errors.New("server_name extension is malformed")
		}
		typ := list[0]
		list = list[1:]
		v, ok := list.vec(2)
		if !ok {
			return "", errors.New("server_name extension is malformed")
		}
		if typ != 0 {
			continue
		}
		if name != "" {
			return "", errors.New("server_name names two hosts")
		}
		n, err := HostName(string(v))
		if err != nil {
			return "", fmt.Errorf("server_name: %w", err)
		}
		name = n
	}
	return name, nil
}

// HostName checks that s is a DNS host name (letters, digits, '-', '_',
// dot-separated labels of at most 63 bytes, at most 253 in all) and returns
// it in lower case without a trailing dot. An IP literal is not a name.
func HostName(s string) (string, error) {
	s = strings.TrimSuffix(s, ".")
	if s == "" {
		return "", errors.New("empty name")
	}
	if len(s) > 253 {
		return "", errors.New("name over 253 bytes")
	}
	if _, err := netip.ParseAddr(s); err == nil {
		return "", fmt.Errorf("%s is an address, not a name", s)
	}
	var b strings.Builder
	for _, label := range strings.Split(s, ".") {
		if label == "" || len(label) > 63 {
			return "", fmt.Errorf("%q has an empty or over-long label", clipName(s))
		}
		if b.Len() > 0 {
			b.WriteByte('.')
		}
		if c, ok := netpolicy.AppendHostLabel(&b, []byte(label)); !ok {
			return "", fmt.Errorf("%q has byte %#x: not a host name", clipName(s), c)
		}
	}
	// A name that is all digits and dots would be read as an address by
	// some resolvers; refuse it too.
	if strings.Trim(b.String(), "0123456789.") == "" {
		return "", fmt.Errorf("%s is numeric, not a name", b.String())
	}
	return b.String(), nil
}

func clipName(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}

// reader reads TLS's length-prefixed fields.
type reader []byte

func (r *reader) skip(n int) bool {
	if len(*r) < n {
		return false
	}
	*r = (*r)[n:]
	return true
}

func (r *reader) u16() (uint16, bool) {
	if len(*r) < 2 {
		return 0, false
	}
	v := binary.BigEndian.Uint16(*r)
	*r = (*r)[2:]
	return v, true
}

// vec reads a vector with an lenBytes-byte length prefix.
func (r *reader) vec(lenBytes int) (reader, bool) {
	if len(*r) < lenBytes {
		return nil, false
	}
	n := 0
	for i := 0; i < lenBytes; i++ {
		n = n<<8 | int((*r)[i])
	}
	if len(*r)-lenBytes < n {
		return nil, false
	}
	v := (*r)[lenBytes : lenBytes+n]
	*r = (*r)[lenBytes+n:]
	return v, true
}

func (r *reader) skipVec(lenBytes int) bool {
	_, ok := r.vec(lenBytes)
	return ok
}
