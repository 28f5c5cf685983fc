package egressgw

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"agentbox.dev/agentbox/internal/egressgw/origintest"
)

// originEdge serves what real origins do that an agent could turn against
// the gateway (origintest, under /api), and more, and says whether it
// answered r:
//   - /api/echo-header echoes the Authorization in response headers and a
//     trailer;
//   - /api/ws upgrades to a WebSocket and echoes its bytes;
//   - /api/switch answers 101 to any request, unasked, then echoes.
func originEdge(w http.ResponseWriter, r *http.Request) bool {
	switch {
	case origintest.Serve(w, r, "/api"):
	case r.URL.Path == "/api/echo-header":
		w.Header().Set("X-Echo", r.Header.Get("Authorization"))
		w.Header().Set("Location", "/login?auth="+url.QueryEscape(r.Header.Get("Authorization")))
		w.Header().Set("Trailer", "X-Trailer-Echo")
		io.WriteString(w, "see headers\n")
		w.Header().Set("X-Trailer-Echo", r.Header.Get("Authorization"))
	case r.URL.Path == "/api/ws" && strings.EqualFold(r.Header.Get("Upgrade"), "websocket"):
		switchAndEcho(w, "websocket")
	case r.URL.Path == "/api/switch":
		switchAndEcho(w, "h2c")
	default:
		return false
	}
	return true
}

// switchAndEcho answers 101 to proto and echoes what arrives after.
func switchAndEcho(w http.ResponseWriter, proto string) {
	c, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return
	}
	defer c.Close()
	fmt.Fprintf(brw, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: %s\r\n\r\n", proto)
	brw.Flush()
	io.Copy(c, bufio.NewReader(brw))
}
