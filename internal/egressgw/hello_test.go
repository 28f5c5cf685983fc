package egressgw

import (
	"bytes"
	"crypto/tls"
	"errors"
	"net"
	"strings"
	"testing"
	"time"
)

// clientHello captures the first flight a real crypto/tls client sends.
func clientHello(t testing.TB, cfg *tls.Config) []byte {
	t.Helper()
	a, b := net.Pipe()
	go func() {
		c := tls.Client(a, cfg)
		c.SetDeadline(time.Now().Add(2 * time.Second))
		c.Handshake()
		a.Close()
	}()
	b.SetReadDeadline(time.Now().Add(2 * time.Second))
	var out bytes.Buffer
	buf := make([]byte, 4096)
	for {
		n, err := b.Read(buf)
		out.Write(buf[:n])
		if _, perr := ParseClientHello(out.Bytes()); perr == nil || !errors.Is(perr, ErrNeedMore) || err != nil {
			break
		}
	}
	b.Close()
	return out.Bytes()
}

// refragment splits a record stream's handshake bytes into records of at
// most n bytes each, as a client may.
func refragment(t *testing.T, b []byte, n int) []byte {
	t.Helper()
	l := int(b[3])<<8 | int(b[4])
	body := b[5 : 5+l]
	var out []byte
	for len(body) > 0 {
		k := min(n, len(body))
		out = append(out, 0x16, 3, 1, byte(k>>8), byte(k))
		out = append(out, body[:k]...)
		body = body[k:]
	}
	return out
}

func TestParseClientHello(t *testing.T) {
	hello := clientHello(t, &tls.Config{ServerName: "API.Example.com", NextProtos: []string{"h2", "http/1.1"}})
	h, err := ParseClientHello(hello)
	if err != nil {
		t.Fatal(err)
	}
	if h.SNI != "api.example.com" || h.ECH || strings.Join(h.ALPN, ",") != "h2,http/1.1" {
		t.Fatalf("hello: %+v", h)
	}
	// Fragmented over records of 50 bytes: the same name.
	if h2, err := ParseClientHello(refragment(t, hello, 50)); err != nil || h2.SNI != "api.example.com" {
		t.Fatalf("fragmented: %+v, %v", h2, err)
	}
	// Every prefix is incomplete, never an answer.
	for i := 0; i < len(hello); i++ {
		if _, err := ParseClientHello(hello[:i]); !errors.Is(err, ErrNeedMore) {
			t.Fatalf("prefix %d: %v", i, err)
		}
	}
	// A client dialling an address sends no name.
	noSNI := clientHello(t, &tls.Config{ServerName: "192.0.2.1", InsecureSkipVerify: true})
	if h, err := ParseClientHello(noSNI); err != nil || h.SNI != "" {
		t.Fatalf("no SNI: %+v, %v", h, err)
	}
}

func TestParseClientHelloRefuses(t *testing.T) {
	hello := clientHello(t, &tls.Config{ServerName: "api.example.com"})
	for _, tc := range []struct {
		name string
		b    []byte
		want string
	}{
		{"HTTP", []byte("GET / HTTP/1.1\r\n\r\n"), "not a handshake"},
		{"SSL 2 version", append([]byte{0x16, 2, 0}, hello[3:]...), "is not TLS"},
		{"zero-length record", []byte{0x16, 3, 1, 0, 0}, "record length 0"},
		{"server hello", append(append([]byte{}, hello[:5]...), append([]byte{2}, hello[6:]...)...), "not a ClientHello"},
		{"huge handshake", []byte{0x16, 3, 1, 0, 4, 1, 0xff, 0xff, 0xff}, "over"},
		{"body truncated", truncatedBody(), "truncated"},
		{"IP literal as SNI", withSNI(t, hello, "192.168.100.200"), "an address, not a name"},
		{"binary SNI", withSNI(t, hello, "api\x00example.com"), "not a host name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseClientHello(tc.b)
			if err == nil || errors.Is(err, ErrNeedMore) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error with %q", err, tc.want)
			}
		})
	}
}

// truncatedBody claims a handshake of the record's length but cuts the
// ClientHello's fields short.
func truncatedBody() []byte {
	return []byte{0x16, 3, 1, 0, 10, 1, 0, 0, 6, 3, 3, 1, 2, 3, 4}
}

// withSNI rewrites the hello's server name in place with name, of the same
// length, so the parser sees bytes no honest client sends.
func withSNI(t *testing.T, hello []byte, name string) []byte {
	t.Helper()
	const orig = "api.example.com"
	i := bytes.Index(hello, []byte(orig))
	if i < 0 || len(name) != len(orig) {
		t.Fatalf("cannot put %q in place of %q", name, orig)
	}
	out := append([]byte(nil), hello...)
	copy(out[i:], name)
	return out
}

func TestHostName(t *testing.T) {
	for in, want := range map[string]string{"API.github.COM.": "api.github.com", "a_b-c.x": "a_b-c.x"} {
		if got, err := HostName(in); err != nil || got != want {
			t.Errorf("HostName(%q) = %q, %v", in, got, err)
		}
	}
	for _, bad := range []string{"", ".", "10.0.0.1", "::1", "1.2.3", "a..b", "a b", "x/y", strings.Repeat("a", 64) + ".b", strings.Repeat("a.", 130) + "b"} {
		if got, err := HostName(bad); err == nil {
			t.Errorf("HostName(%q) = %q, want an error", bad, got)
		}
	}
}

func TestScrubPath(t *testing.T) {
	for in, want := range map[string]string{
		"/":                        "/",
		"/a/b?token=s3cr3t&x=1&y":  "/a/b?token=...&x=...&y",
		"/search?q=what+is+secret": "/search?q=...",
	} {
		if got := ScrubPath(in); got != want {
			t.Errorf("ScrubPath(%q) = %q, want %q", in, got, want)
		}
	}
	if got := ScrubPath("/" + strings.Repeat("a", 2000)); len(got) > 540 {
		t.Errorf("long path kept %d bytes", len(got))
	}
}

func FuzzParseClientHello(f *testing.F) {
	f.Add(clientHello(f, &tls.Config{ServerName: "api.example.com", NextProtos: []string{"h2"}}))
	f.Add([]byte{0x16, 3, 1, 0, 4, 1, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := ParseClientHello(b)
		if err == nil && h.SNI != "" {
			if _, err := HostName(h.SNI); err != nil {
				t.Fatalf("SNI %q passed but is not a host name: %v", h.SNI, err)
			}
		}
	})
}
