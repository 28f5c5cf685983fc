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
// forwarded, its tokens when its response has been read: calls in flight
// when a bound is reached finish.
type usage struct {
	mu     sync.Mutex
	total  ModelUsage
	recent []time.Time // calls in the last minute
}

// Limit names which bound refused a call ("" none), and says why.
func (u *usage) take(b policy.ModelBudget, now time.Time) (limit, why string) {
	u.mu.Lock()
	defer u.mu.Unlock()
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
	case b.Requests > 0 && u.total.Requests >= b.Requests:
		return "model_requests", fmt.Sprintf("this sandbox's model budget is spent: %d of %d calls made (limits.model.requests)", u.total.Requests, b.Requests)
	case b.RequestsPerMinute > 0 && int64(len(u.recent)) >= b.RequestsPerMinute:
		return "model_requests_per_minute", fmt.Sprintf("this sandbox made %d model calls in the last minute, its bound (limits.model.perMinute.requests)", len(u.recent))
	}
	u.total.Requests++
	u.recent = append(u.recent, now)
	return "", ""
}

func (u *usage) addTokens(n int64) {
	u.mu.Lock()
	u.total.Tokens += n
	u.mu.Unlock()
}

// ModelUsage is what the sandbox's model calls have used so far.
func (g *Gateway) ModelUsage() ModelUsage {
	g.usage.mu.Lock()
	defer g.usage.mu.Unlock()
	return g.usage.total
}

// SetModelUsage starts the counts at u: a restored sandbox's are its
// checkpoint's.
func (g *Gateway) SetModelUsage(u ModelUsage) {
	g.usage.mu.Lock()
	g.usage.total = u
	g.usage.mu.Unlock()
}

// quotaAnswer writes the 429 the vendor of api sends when a quota or rate
// limit is hit, with msg: the client shows it as it would the vendor's.
func quotaAnswer(w http.ResponseWriter, api modelapi.API, limit, msg string) {
	msg = "agentbox: " + msg
	var body any
	switch api {
	case modelapi.Anthropic:
		body = map[string]any{"type": "error", "error": map[string]string{"type": "rate_limit_error", "message": msg}}
	case modelapi.Gemini:
		body = map[string]any{"error": map[string]any{"code": 429, "message": msg, "status": "RESOURCE_EXHAUSTED"}}
	default:
		code := "insufficient_quota"
		if limit == "model_requests_per_minute" {
			code = "rate_limit_exceeded"
		}
		body = map[string]any{"error": map[string]any{"message": msg, "type": code, "param": nil, "code": code}}
	}
	b, _ := json.Marshal(body)
	if limit == "model_requests_per_minute" {
		w.Header().Set("Retry-After", "60")
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(http.StatusTooManyRequests)
	w.Write(b)
}
