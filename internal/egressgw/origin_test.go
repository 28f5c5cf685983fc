package egressgw

import (
	"bufio"
	"compress/gzip"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strings"
)

// originEdge serves what real origins do that an agent could turn against
// the gateway, and says whether it answered r:
//   - TRACE is echoed (Apache's default);
//   - /api/echo* echo the request's headers: as text (gzipped when the
//     client asks), always gzipped, "br"-encoded, base64, JSON, or in
//     response headers;
//   - /api/ws upgrades to a WebSocket and echoes its bytes;
//   - /api/switch answers 101 to any request, unasked, then echoes.
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
	switch {
	case r.Method == "TRACE":
		w.Header().Set("Content-Type", "message/http")
		fmt.Fprintf(w, "TRACE %s HTTP/1.1\n%s", r.RequestURI, dump())
	case r.URL.Path == "/api/echo":
		if strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
			gz(dump())
		} else {
			io.WriteString(w, dump())
		}
	case r.URL.Path == "/api/echo-gzip":
		gz(dump())
	case r.URL.Path == "/api/echo-br":
		w.Header().Set("Content-Encoding", "br")
		io.WriteString(w, dump())
	case r.URL.Path == "/api/echo-base64":
		io.WriteString(w, "dump="+base64.StdEncoding.EncodeToString([]byte(dump()))+"\n")
	case r.URL.Path == "/api/echo-json":
		json.NewEncoder(w).Encode(r.Header)
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
