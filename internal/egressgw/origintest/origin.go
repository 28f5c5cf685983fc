// Package origintest is a test origin that behaves as real ones do where an
// agent could turn that against the egress gateway: it echoes TRACE, and
// echoes a request's headers back, plain, gzipped, base64 and as JSON. The
// gateway's unit tests and the e2e suite's web host both serve it.
package origintest

import (
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
)

// Serve answers r if it is one of these, and says whether it did:
//   - TRACE, to any path: the request echoed back (Apache's default);
//   - PREFIX/echo: the request's headers (httpbin, error pages that quote
//     the request), gzipped when the client asks;
//   - PREFIX/echo-gzip: gzipped always; PREFIX/echo-br: marked "br";
//   - PREFIX/echo-base64, PREFIX/echo-json: encoded;
//   - PREFIX/echo-hints: a 103 Early Hints whose Link quotes the
//     request's Authorization, then the answer; PREFIX/hints: an honest
//     103;
//   - PREFIX/echo-stacked: gzipped under two Content-Encoding lines
//     (identity, then gzip); PREFIX/echo-gzip-twice: gzipped twice;
//   - PREFIX/echo-mime: base64 as MIME writes it, in 76 columns.
func Serve(w http.ResponseWriter, r *http.Request, prefix string) bool {
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
	gzipped := func(s string) []byte {
		var b bytes.Buffer
		zw := gzip.NewWriter(&b)
		io.WriteString(zw, s)
		zw.Close()
		return b.Bytes()
	}
	path, ok := strings.CutPrefix(r.URL.Path, prefix)
	switch {
	case r.Method == "TRACE":
		w.Header().Set("Content-Type", "message/http")
		fmt.Fprintf(w, "TRACE %s HTTP/1.1\n%s", r.RequestURI, dump())
	case !ok:
		return false
	case path == "/echo":
		if strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
			gz(dump())
		} else {
			io.WriteString(w, dump())
		}
	case path == "/echo-gzip":
		gz(dump())
	case path == "/echo-br":
		w.Header().Set("Content-Encoding", "br")
		io.WriteString(w, dump())
	case path == "/echo-base64":
		io.WriteString(w, base64.StdEncoding.EncodeToString([]byte(dump()))+"\n")
	case path == "/echo-json":
		json.NewEncoder(w).Encode(r.Header)
	case path == "/echo-hints", path == "/hints":
		link := "</style.css>; rel=preload"
		if path == "/echo-hints" {
			link = "</style.css?auth=" + r.Header.Get("Authorization") + ">; rel=preload"
		}
		w.Header().Set("Link", link)
		w.WriteHeader(http.StatusEarlyHints)
		w.Header().Del("Link")
		io.WriteString(w, "after the hints\n")
	case path == "/echo-stacked":
		w.Header()["Content-Encoding"] = []string{"identity", "gzip"}
		w.Write(gzipped(dump()))
	case path == "/echo-gzip-twice":
		w.Header()["Content-Encoding"] = []string{"gzip", "gzip"}
		w.Write(gzipped(string(gzipped(dump()))))
	case path == "/echo-mime":
		w.Header().Set("Content-Type", "message/rfc822")
		io.WriteString(w, "Content-Transfer-Encoding: base64\r\n\r\n")
		enc := base64.StdEncoding.EncodeToString([]byte(dump()))
		for len(enc) > 76 {
			io.WriteString(w, enc[:76]+"\r\n")
			enc = enc[76:]
		}
		io.WriteString(w, enc+"\r\n")
	default:
		return false
	}
	return true
}
