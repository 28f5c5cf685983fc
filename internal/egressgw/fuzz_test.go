package egressgw

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"agentbox.dev/agentbox/internal/netpolicy"
)

// FuzzHTTPFront: whatever bytes the agent sends as requests, the origin
// behind the gateway receives only what the gateway decided to forward: a
// Host a rule allows (on the connection's own port), never TRACE, TRACK
// or CONNECT, no Upgrade but a WebSocket under the rule that allows it,
// no target another host could be read from, and no placeholder; and the
// gateway neither crashes nor hangs.
func FuzzHTTPFront(f *testing.F) {
	for _, seed := range []string{
		"GET / HTTP/1.1\r\nHost: a.test\r\n\r\n",
		"GET http://other.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n",
		"GET /x HTTP/1.1\r\nHost: a.test\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n\r\n",
		"GET /api/ws HTTP/1.1\r\nHost: a.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
		"GET /api/ws HTTP/1.1\r\nHost: b.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
		"TRACE / HTTP/1.1\r\nHost: a.test\r\n\r\n",
		"GET //other.test/x HTTP/1.1\r\nHost: a.test\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a.test:other.test\r\n\r\n",
		"POST /x HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n0\r\n\r\nGET / HTTP/1.1\r\nHost: other.test\r\n\r\n",
		"GET /?k=" + strings.ReplaceAll(placeholder, "-", "%2d") + " HTTP/1.1\r\nHost: a.test\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a.test\r\n\r\nGET / HTTP/1.1\r\nHost: other.test\r\n\r\n",
		"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
	} {
		f.Add([]byte(seed))
	}
	var mu sync.Mutex
	var bad []string
	fx := newFixtureWith(f, false, Config{HelloTimeout: 300 * time.Millisecond, Secrets: []Secret{{Host: "b.test", Header: "Authorization", Value: "Bearer s3cret-value", Secret: "s3cret-value", Placeholder: placeholder}}},
		func(port int) netpolicy.Plan { return wsPlan(f, port, true) })
	fx.site.check = func(r *http.Request) {
		var why string
		host, port := splitHost(r.Host)
		switch {
		case host != "a.test" && host != "b.test":
			why = "host " + r.Host
		case port != "" && port != fmt.Sprint(fx.port):
			why = "host port " + r.Host
		case r.Method == "TRACE" || r.Method == "TRACK" || r.Method == "CONNECT":
			why = "method " + r.Method
		case r.Header.Get("Upgrade") != "" && !(strings.EqualFold(r.Header.Get("Upgrade"), "websocket") && host == "a.test"):
			why = "upgrade " + r.Header.Get("Upgrade") + " to " + host
		case strings.HasPrefix(r.RequestURI, "//"):
			why = "target " + r.RequestURI
		case targetHolds(r.RequestURI, placeholder):
			why = "placeholder in " + r.RequestURI
		}
		for _, vs := range r.Header {
			for _, v := range vs {
				if strings.Contains(v, placeholder) {
					why = "placeholder in a header"
				}
			}
		}
		if why != "" {
			mu.Lock()
			bad = append(bad, why)
			mu.Unlock()
		}
	}
	go func() {
		for range fx.events {
		}
	}()
	f.Fuzz(func(t *testing.T, req []byte) {
		c, err := net.Dial("tcp4", fmt.Sprintf("127.0.0.1:%d", fx.port))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(3 * time.Second))
		c.Write(req)
		c.(*net.TCPConn).CloseWrite()
		io.Copy(io.Discard, c)
		mu.Lock()
		defer mu.Unlock()
		if len(bad) > 0 {
			t.Fatalf("the origin received %q (input %q)", bad, req)
		}
	})
}
