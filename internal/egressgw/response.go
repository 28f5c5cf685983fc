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
		body := res.Body
		if len(x.forms) == 0 {
			dec, err := decoded(res)
			if err != nil {
				return err
			}
			body = readCloser{dec, res.Body}
		}
		m.res = modelapi.NewResponseTap(m.call.API, res.Header.Get("Content-Type"))
		res.Body = modelBody{body, m}
	}
	if res.Body != nil && res.Body != http.NoBody {
		// Outermost: a body the gateway cannot decode is cut too.
		res.Body = cutBody{res.Body, x}
	}
	return nil
}

// scrubHeader is h with every form of the secrets replaced in its values.
func scrubHeader(forms []secretForm, h http.Header, where string, found *reflections) http.Header {
	for k, vs := range h {
		for i, v := range vs {
			vs[i] = replaceForms(forms, v, where+" "+k, found)
		}
	}
	return h
}

// decoded is res's body without its content coding, for the scan: gzip
// and deflate are undone (the agent gets the body as identity), any other
// coding is refused: the gateway asked for none.
func decoded(res *http.Response) (io.Reader, error) {
	ce := strings.ToLower(strings.TrimSpace(res.Header.Get("Content-Encoding")))
	body := res.Body
	switch ce {
	case "", "identity":
		// A body's replacements keep its length.
		return body, nil
	}
	// Decoded, the body has another length.
	res.Header.Del("Content-Encoding")
	res.Header.Del("Content-Length")
	res.ContentLength = -1
	switch ce {
	case "gzip", "x-gzip":
		return &lazyReader{open: func() (io.Reader, error) { return gzip.NewReader(body) }}, nil
	case "deflate":
		return &lazyReader{open: func() (io.Reader, error) { return zlib.NewReader(body) }}, nil
	}
	return nil, fmt.Errorf("the response is %s-encoded, which the gateway cannot scan for the injected secret (it asked for no encoding)", clipName(ce))
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
