package ingest

// Reading a syscall's arguments as gVisor sends them: paths resolved,
// flags, socket families and addresses named, lists clipped.

import (
	"encoding/binary"
	"fmt"
	"net"
	"path"
	"strings"

	"agentbox.dev/agentbox/internal/audit"
)

// clip bounds a string from the sandbox. Invalid UTF-8 is replaced when
// the record is encoded.
func clip(s string) string {
	if len(s) > maxStringLen {
		return s[:maxStringLen] + "...(truncated)"
	}
	return s
}

func clipList(l []string) []string {
	n := len(l)
	if n > maxArgs {
		l = l[:maxArgs]
	}
	out := make([]string, 0, len(l)+1)
	for _, s := range l {
		out = append(out, clip(s))
	}
	if n > maxArgs {
		out = append(out, fmt.Sprintf("...(%d more)", n-maxArgs))
	}
	return out
}

// resolve joins a path relative to a directory fd (or the cwd) the way the
// kernel would, for the record only.
func resolve(fdPath, p, cwd string) string {
	p = clip(p)
	if p == "" || path.IsAbs(p) {
		return p
	}
	dir := fdPath
	if dir == "" {
		dir = cwd
	}
	if dir == "" {
		return p
	}
	return path.Join(clip(dir), p)
}

var syscallNames = map[uint64]string{2: "open", 85: "creat", 257: "openat", 80: "chdir", 81: "fchdir", 43: "accept", 288: "accept4"}

func syscallName(no uint64, fallback string) string {
	if n, ok := syscallNames[no]; ok {
		return n
	}
	return fallback
}

func openFlags(f uint32) string {
	var parts []string
	switch f & 3 {
	case 0:
		parts = append(parts, "O_RDONLY")
	case 1:
		parts = append(parts, "O_WRONLY")
	case 2:
		parts = append(parts, "O_RDWR")
	}
	for _, fl := range []struct {
		bit  uint32
		name string
	}{{0x40, "O_CREAT"}, {0x80, "O_EXCL"}, {0x200, "O_TRUNC"}, {0x400, "O_APPEND"}, {0x800, "O_NONBLOCK"}, {0x10000, "O_DIRECTORY"}, {0x20000, "O_NOFOLLOW"}, {0x80000, "O_CLOEXEC"}, {0x200000, "O_PATH"}, {0x400000, "O_TMPFILE"}} {
		if f&fl.bit != 0 {
			parts = append(parts, fl.name)
		}
	}
	return strings.Join(parts, "|")
}

func family(f uint16) string {
	switch f {
	case 1:
		return "unix"
	case 2:
		return "inet"
	case 10:
		return "inet6"
	case 16:
		return "netlink"
	case 17:
		return "packet"
	}
	return fmt.Sprintf("af_%d", f)
}

func sockType(t int32) string {
	switch t & 0xf {
	case 1:
		return "stream"
	case 2:
		return "dgram"
	case 3:
		return "raw"
	case 5:
		return "seqpacket"
	}
	return fmt.Sprintf("type_%d", t&0xf)
}

// sockaddr decodes a raw sockaddr from the sandbox, checking every length.
func sockaddr(b []byte) *audit.Endpoint {
	if len(b) < 2 {
		return nil
	}
	fam := binary.LittleEndian.Uint16(b[0:2])
	e := &audit.Endpoint{Family: family(fam)}
	switch fam {
	case 2:
		if len(b) >= 8 {
			e.Port = int(binary.BigEndian.Uint16(b[2:4]))
			e.IP = net.IP(b[4:8]).String()
		}
	case 10:
		if len(b) >= 24 {
			e.Port = int(binary.BigEndian.Uint16(b[2:4]))
			e.IP = net.IP(b[8:24]).String()
		}
	case 1:
		p := b[2:]
		if len(p) > 0 && p[0] == 0 {
			e.Path = "@" + clip(strings.TrimRight(string(p[1:]), "\x00"))
		} else {
			if i := strings.IndexByte(string(p), 0); i >= 0 {
				p = p[:i]
			}
			e.Path = clip(string(p))
		}
	}
	return e
}
