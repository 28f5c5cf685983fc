package egressgw

// A model call's admission and settlement. Under a token budget a call
// reserves its bound before it goes (its input's size, its output cap, a
// cap set on it when it names none) and is charged once done: the final
// usage its response says, or, when that cannot be read (a stream cut
// short or without usage, an endpoint that gives none), its reservation.
// An endpoint whose billing the gateway does not read is refused.

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"agentbox.dev/agentbox/internal/modelapi"
	"agentbox.dev/agentbox/internal/policy"
)

// methodOverrides are headers some vendors' front ends take as the
// request's method: a call could be read as one endpoint and served as
// another.
var methodOverrides = []string{"X-Http-Method-Override", "X-Http-Method", "X-Method-Override"}

// admitModel admits a call to a model host of api, or answers it as the
// vendor would refuse it (ok false). Admitted, settle is to run once the
// call is done: it records the call and charges it.
func (g *Gateway) admitModel(cw *countingWriter, r *http.Request, api modelapi.API, b policy.ModelBudget, keep string, x *exchange, ev *Event, websocket bool, start time.Time) (settle func(), ok bool) {
	refuse := func(status int, limit, why string) (func(), bool) {
		ev.Kind, ev.Reason, ev.Limit = Refused, why, limit
		vendorError(cw, api, status, limit, why)
		return nil, false
	}
	ep := modelapi.EndpointOf(api, r.Method, r.URL.Path)
	if b.Tokens > 0 {
		switch {
		case websocket:
			return refuse(http.StatusForbidden, "model_unaccounted", "a WebSocket to a model host is not served under a token budget (limits.model.tokens): its usage is not read")
		case ep.Billing == modelapi.Unaccounted:
			return refuse(http.StatusForbidden, "model_unaccounted", fmt.Sprintf("%s is not served under a token budget (limits.model.tokens): the gateway does not read what it bills", ep.Name))
		}
		for _, h := range methodOverrides {
			if r.Header.Get(h) != "" {
				return refuse(http.StatusBadRequest, "model_unaccounted", h+" is not served under a token budget (limits.model.tokens): the call could be served as another endpoint than the one accounted")
			}
		}
	}
	if websocket {
		return func() {}, true
	}
	m := &modelTap{start: start, call: ModelCall{API: api, Application: clipName(r.Header.Get("User-Agent")), Keep: keep, Endpoint: ep, Budgeted: b.Tokens > 0}}
	body := r.Body
	if body == nil {
		body = http.NoBody
	}
	m.req = modelapi.NewRequestTap(api, r.URL.RequestURI(), body)
	if body != http.NoBody {
		r.Body = m.req
	}
	var res modelapi.Reservation
	if b.Tokens > 0 && ep.Billing != modelapi.Free {
		// Read whole before it goes: its size bounds its input, and it
		// names its cap. More than the budget has left could never go.
		if limit, why := g.usage.check(b, 1, time.Now()); limit != "" {
			return refuse(http.StatusTooManyRequests, limit, why)
		}
		limit := min(g.usage.left(b.Tokens), modelapi.MaxRequest)
		raw, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
		switch {
		case errors.Is(err, errSlowBody):
			ev.Kind, ev.Reason = Refused, errSlowBody.Error()
			http.Error(cw, "agentbox egress gateway: "+err.Error(), http.StatusRequestTimeout)
			return nil, false
		case err != nil:
			return refuse(http.StatusBadRequest, "model_unaccounted", "the request body could not be read: "+err.Error())
		case int64(len(raw)) > limit && limit == modelapi.MaxRequest:
			return refuse(http.StatusRequestEntityTooLarge, "model_unaccounted", fmt.Sprintf("a request body over %d bytes is not served under a token budget (limits.model.tokens)", modelapi.MaxRequest))
		case int64(len(raw)) > limit:
			return refuse(http.StatusTooManyRequests, "model_tokens", g.usage.tooLarge(b, limit))
		}
		var set []byte
		capDefault := b.MaxOutput
		if capDefault <= 0 {
			capDefault = min(policy.DefaultModelMaxOutput, b.Tokens)
		}
		if res, set, err = modelapi.Reserve(api, ep, raw, capDefault); err != nil {
			return refuse(http.StatusBadRequest, "model_unaccounted", "the gateway cannot account for this call under a token budget (limits.model.tokens): "+err.Error())
		}
		if set != nil {
			raw, m.call.CapSet = set, capDefault
		}
		r.Body, r.ContentLength, r.TransferEncoding = io.NopCloser(bytes.NewReader(raw)), int64(len(raw)), nil
		r.Header.Set("Content-Length", strconv.Itoa(len(raw)))
		m.call.Reserved = res.Tokens()
	}
	if limit, why := g.usage.take(b, res.Tokens(), time.Now()); limit != "" {
		return refuse(http.StatusTooManyRequests, limit, why)
	}
	x.model = m
	return func() {
		ev.Model = m.result()
		ev.Model.Charged = modelapi.Charge(ep.Billing, res, m.status, ev.Model.Response)
		g.usage.settle(res.Tokens(), ev.Model.Charged)
	}, true
}
