package egressgw

// The model budget: a role's limits.model, counted here from the model
// hosts' own responses. Past a bound, the gateway answers the client as
// its vendor does when a quota is spent.

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"agentbox.dev/agentbox/internal/modelapi"
	"agentbox.dev/agentbox/internal/policy"
)

// ModelUsage is what a sandbox's model calls have used: it survives a
// checkpoint (the shim keeps it in the image's manifest).
type ModelUsage struct {
	Tokens   int64 `json:"tokens"`
	Requests int64 `json:"requests"`
}

// usage counts a gateway's model calls. A call is counted when it is
// forwarded. Under a token budget it reserves its bound first (its input's
// size and its output cap), and is charged once done: the calls in flight
// never hold more than the budget left.
type usage struct {
	mu    sync.Mutex
	total ModelUsage
	// reserved are the reservations of the calls in flight.
	reserved int64
	recent   []time.Time // calls in the last minute
}

// take admits a call that reserves reserve tokens, or names the bound that
// refuses it ("" none) and says why.
func (u *usage) take(b policy.ModelBudget, reserve int64, now time.Time) (limit, why string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if limit, why := u.refusal(b, reserve, now); limit != "" {
		return limit, why
	}
	u.total.Requests++
	u.reserved += reserve
	u.recent = append(u.recent, now)
	return "", ""
}

// check says what take would, and takes nothing.
func (u *usage) check(b policy.ModelBudget, reserve int64, now time.Time) (limit, why string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.refusal(b, reserve, now)
}

// refusal names the bound a call reserving reserve would pass ("" none).
// u.mu is held.
func (u *usage) refusal(b policy.ModelBudget, reserve int64, now time.Time) (limit, why string) {
	keep := u.recent[:0]
	for _, t := range u.recent {
		if now.Sub(t) < time.Minute {
			keep = append(keep, t)
		}
	}
	u.recent = keep
	switch {
	case b.Tokens > 0 && u.total.Tokens >= b.Tokens:
		return "model_tokens", fmt.Sprintf("this sandbox's model budget is spent: %d of %d tokens used (limits.model.tokens)", u.total.Tokens, b.Tokens)
	case b.Tokens > 0 && u.total.Tokens+u.reserved+reserve > b.Tokens:
		return "model_tokens", u.passes(b, fmt.Sprintf("%d tokens (its input's size and its output cap)", reserve))
	case b.Requests > 0 && u.total.Requests >= b.Requests:
		return "model_requests", fmt.Sprintf("this sandbox's model budget is spent: %d of %d calls made (limits.model.requests)", u.total.Requests, b.Requests)
	case b.RequestsPerMinute > 0 && int64(len(u.recent)) >= b.RequestsPerMinute:
		return "model_requests_per_minute", fmt.Sprintf("this sandbox made %d model calls in the last minute, its bound (limits.model.perMinute.requests)", len(u.recent))
	}
	return "", ""
}

// passes says a call that reserves what would pass budget b. u.mu is held.
func (u *usage) passes(b policy.ModelBudget, what string) string {
	return fmt.Sprintf("this call would pass this sandbox's model budget: it reserves %s, and %d of %d are left (%d used, %d reserved by calls in flight) (limits.model.tokens)",
		what, u.leftLocked(b.Tokens), b.Tokens, u.total.Tokens, u.reserved)
}

// tooLarge says a call whose input alone, more than n bytes, would pass b.
func (u *usage) tooLarge(b policy.ModelBudget, n int64) string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.passes(b, fmt.Sprintf("more than %d tokens (its input's size alone: more than %d bytes, a token a byte at most)", n, n))
}

// left is what a budget of tokens has left, the calls in flight reserved.
func (u *usage) left(tokens int64) int64 {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.leftLocked(tokens)
}

// leftLocked is left with u.mu held.
func (u *usage) leftLocked(tokens int64) int64 {
	return max(tokens-u.total.Tokens-u.reserved, 0)
}

// settle ends a call that reserved reserve: it is charged charge.
func (u *usage) settle(reserve, charge int64) {
	u.mu.Lock()
	u.reserved -= reserve
	u.total.Tokens += charge
	u.mu.Unlock()
}

// ModelUsage is what the sandbox's model calls have used so far, the
// reservations of the calls in flight counted as used (a checkpoint's
// counts never miss a call it cut).
func (g *Gateway) ModelUsage() ModelUsage {
	g.usage.mu.Lock()
	defer g.usage.mu.Unlock()
	u := g.usage.total
	u.Tokens += g.usage.reserved
	return u
}

// SetModelUsage starts the counts at u: a restored sandbox's are its
// checkpoint's.
func (g *Gateway) SetModelUsage(u ModelUsage) {
	g.usage.mu.Lock()
	g.usage.total = u
	g.usage.mu.Unlock()
}

// vendorError writes the error the vendor of api sends with status, of
// its kind (a quota, a refusal, a request it cannot take), with msg: the
// client shows it as it would the vendor's.
func vendorError(w http.ResponseWriter, api modelapi.API, status int, limit, msg string) {
	msg = "agentbox: " + msg
	var body any
	switch api {
	case modelapi.Anthropic:
		typ := map[int]string{http.StatusTooManyRequests: "rate_limit_error", http.StatusForbidden: "permission_error",
			http.StatusRequestEntityTooLarge: "request_too_large"}[status]
		if typ == "" {
			typ = "invalid_request_error"
		}
		body = map[string]any{"type": "error", "error": map[string]string{"type": typ, "message": msg}}
	case modelapi.Gemini:
		st := map[int]string{http.StatusTooManyRequests: "RESOURCE_EXHAUSTED", http.StatusForbidden: "PERMISSION_DENIED"}[status]
		if st == "" {
			st = "INVALID_ARGUMENT"
		}
		body = map[string]any{"error": map[string]any{"code": status, "message": msg, "status": st}}
	default:
		code := "invalid_request_error"
		switch {
		case limit == "model_requests_per_minute":
			code = "rate_limit_exceeded"
		case status == http.StatusTooManyRequests:
			code = "insufficient_quota"
		}
		body = map[string]any{"error": map[string]any{"message": msg, "type": code, "param": nil, "code": code}}
	}
	b, _ := json.Marshal(body)
	if limit == "model_requests_per_minute" {
		w.Header().Set("Retry-After", "60")
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	w.Write(b)
}
