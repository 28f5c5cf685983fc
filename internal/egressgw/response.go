package egressgw

// What a response may carry back: the upgrades the gateway asked for, and
// the injected secrets, found in its headers and body and replaced.

import (
	"compress/gzip"
	"compress/zlib"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"agentbox.dev/agentbox/internal/modelapi"
)

// checkResponse is the front's ModifyResponse: it refuses a switch of
// protocols the gateway did not allow, and scrubs the injected secrets
// out of a response of their host.
func (g *Gateway) checkResponse(res *http.Response) error {
	x, _ := res.Request.Context().Value(exchangeKey).(*exchange)
	if x == nil {
		return errors.New("internal error: a response without its exchange")
	}
	if x.model != nil {
		x.model.status = res.StatusCode
	}
	if res.StatusCode == http.StatusSwitchingProtocols {
		up := responseUpgrade(res.Header)
		if !x.websocket || !strings.EqualFold(up, "websocket") {
			return fmt.Errorf("the origin switched protocols to %q, which the gateway did not allow", clipName(up))
		}
		if len(x.forms) > 0 {
			res.Header = scrubHeader(x.forms, res.Header, "header", &x.found)
		}
		x.opened()
		return nil
	}
	if len(x.forms) > 0 {
		res.Header = scrubHeader(x.forms, res.Header, "header", &x.found)
		if res.Body != nil && res.Body != http.NoBody {
			body, err := decoded(res)
			if err != nil {
				return err
			}
			res.Body = readCloser{newScrubReader(body, x.forms, &x.found, func() {
				if len(res.Trailer) > 0 {
					res.Trailer = scrubHeader(x.forms, res.Trailer, "trailer", &x.found)
				}
			}), res.Body}
		}
	}
	if m := x.model; m != nil && res.Body != nil {
		// Read after the scrub: a secret echoed in a tool call's input
		// is the placeholder there too.
		body, err := plainBody(res, x)
		if err != nil {
			return err
		}
		m.res = modelapi.NewResponseTap(m.call.API, res.Header.Get("Content-Type"))
		res.Body = modelBody{body, m}
	}
	if m := x.mcp; m != nil && res.Body != nil && res.Body != http.NoBody {
		// Filtered after the scrub, as the agent would read it.
		body, err := plainBody(res, x)
		if err == nil {
			name, _ := res.Request.Context().Value(nameKey).(string)
			res.Body, err = g.mcpResponse(res, body, m, name)
		}
		if err != nil {
			return err
		}
	}
	if res.Body != nil && res.Body != http.NoBody {
		// Outermost: a body the gateway cannot decode is cut too.
		res.Body = cutBody{res.Body, x}
	}
	return nil
}

// plainBody is res's body without its content codings: the scrub
// decoded it already, when one runs.
func plainBody(res *http.Response, x *exchange) (io.ReadCloser, error) {
	if len(x.forms) > 0 {
		return res.Body, nil
	}
	dec, err := decoded(res)
	if err != nil {
		return nil, err
	}
	return readCloser{dec, res.Body}, nil
}

// maxCodings bounds the content codings of a response the gateway
// decodes to scan.
const maxCodings = 4

// contentCodings are the content codings of h, in the order they were
// applied: every Content-Encoding field, every comma-separated item of
// each, "identity" left out.
func contentCodings(h http.Header) []string {
	var out []string
	for _, v := range h.Values("Content-Encoding") {
		for _, c := range strings.Split(v, ",") {
			if c = strings.ToLower(strings.TrimSpace(c)); c != "" && c != "identity" {
				out = append(out, c)
			}
		}
	}
	return out
}

// decoded is res's body without its content codings, for the scan: each
// layer of gzip and deflate is undone, last applied first (the agent gets
// the body as identity). A response with a coding the gateway cannot undo,
// or more than maxCodings, is refused: it asked for none, and compressed
// bytes are never scanned as if they were plain.
func decoded(res *http.Response) (io.Reader, error) {
	codings := contentCodings(res.Header)
	res.Header.Del("Content-Encoding")
	if len(codings) == 0 {
		// A body's replacements keep its length.
		return res.Body, nil
	}
	if len(codings) > maxCodings {
		return nil, fmt.Errorf("the response has %d content codings, more than the %d the gateway decodes to scan for the injected secret", len(codings), maxCodings)
	}
	// Decoded, the body has another length.
	res.Header.Del("Content-Length")
	res.ContentLength = -1
	var body io.Reader = res.Body
	for i := len(codings) - 1; i >= 0; i-- {
		src := body
		switch codings[i] {
		case "gzip", "x-gzip":
			body = &lazyReader{open: func() (io.Reader, error) { return gzip.NewReader(src) }}
		case "deflate":
			body = &lazyReader{open: func() (io.Reader, error) { return zlib.NewReader(src) }}
		default:
			return nil, fmt.Errorf("the response is %s-encoded, which the gateway cannot scan for the injected secret (it asked for no encoding)", clipName(codings[i]))
		}
	}
	return body, nil
}

// lazyReader opens its reader at the first Read (a gzip reader reads its
// header when made: the response must not wait for the body).
type lazyReader struct {
	open func() (io.Reader, error)
	r    io.Reader
	err  error
}

func (l *lazyReader) Read(p []byte) (int, error) {
	if l.r == nil && l.err == nil {
		l.r, l.err = l.open()
	}
	if l.err != nil {
		return 0, l.err
	}
	return l.r.Read(p)
}

// readCloser reads from one reader and closes another.
type readCloser struct {
	io.Reader
	io.Closer
}
