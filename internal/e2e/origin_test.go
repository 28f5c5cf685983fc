//go:build e2e

package e2e

import (
	"compress/gzip"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"

	"golang.org/x/net/websocket"
)

// originEdge answers what real origins do that an agent could turn
// against the gateway, and says whether it answered r:
//   - TRACE is echoed back, request headers and all (Apache's default);
//   - /echo echoes the request's headers (httpbin, many error pages),
//     gzipped when the client asks; /echo-gzip gzips them always;
//     /echo-base64 and /echo-json encode them;
//   - /ws is a WebSocket that echoes each message.
func originEdge(w http.ResponseWriter, r *http.Request) bool {
	dump := func() string {
		var lines []string
		for k, vs := range r.Header {
			for _, v := range vs {
				lines = append(lines, k+": "+v)
			}
		}
		sort.Strings(lines)
		return strings.Join(lines, "\n") + "\n"
	}
	gz := func(s string) {
		w.Header().Set("Content-Encoding", "gzip")
		zw := gzip.NewWriter(w)
		io.WriteString(zw, s)
		zw.Close()
	}
	switch path := r.URL.Path; {
	case r.Method == "TRACE":
		w.Header().Set("Content-Type", "message/http")
		fmt.Fprintf(w, "TRACE %s HTTP/1.1\n%s", r.RequestURI, dump())
	case path == "/echo":
		if strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
			gz(dump())
		} else {
			io.WriteString(w, dump())
		}
	case path == "/echo-gzip":
		gz(dump())
	case path == "/echo-base64":
		io.WriteString(w, base64.StdEncoding.EncodeToString([]byte(dump()))+"\n")
	case path == "/echo-json":
		json.NewEncoder(w).Encode(r.Header)
	case path == "/ws":
		websocket.Server{Handler: func(ws *websocket.Conn) {
			var msg string
			for websocket.Message.Receive(ws, &msg) == nil {
				websocket.Message.Send(ws, "echo "+msg)
			}
		}}.ServeHTTP(w, r)
	default:
		return false
	}
	return true
}
