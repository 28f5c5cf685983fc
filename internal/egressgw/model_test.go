package egressgw

import (
	"bufio"
	"compress/gzip"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"agentbox.dev/agentbox/internal/modelapi"
	"agentbox.dev/agentbox/internal/netpolicy"
	"agentbox.dev/agentbox/internal/policy"
)

// A model host's stream reaches the agent as it comes (the origin holds
// its second half until the agent has read the first), and the gateway's
// record says what the call was: the model asked for and the one that
// answered, the tokens, the stop reason, the tool call and its input, the
// client, the request's digest. A secret the origin echoes into a tool
// call's input is the placeholder in the record too.
func TestModelCallStreamed(t *testing.T) {
	ca, err := NewCA("sandbox-1", []string{"a.test", "b.test"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{CA: ca, Secrets: []Secret{{Host: "b.test", Header: "X-Api-Key", Value: "s3cret-value", Secret: "s3cret-value", Placeholder: placeholder}}}
	f := newFixtureWith(t, true, cfg, func(port int) netpolicy.Plan {
		pl, err := netpolicy.Compile(&policy.Profile{
			Network: policy.NetworkProfile{Egress: policy.EgressAllowlist, Allow: []policy.EgressRule{
				{Host: "a.test", Ports: []int{port}, API: "anthropic"},
				{Host: "b.test", Ports: []int{port}, API: "anthropic"},
			}},
			Credentials: policy.CredentialsProfile{Secrets: []policy.Secret{{Env: "ANTHROPIC_API_KEY", File: "/f", Inject: &policy.Inject{Host: "b.test", Header: "x-api-key"}}}},
		})
		if err != nil {
			t.Fatal(err)
		}
		return *pl
	})
	release := make(chan struct{})
	released := make(chan bool, 2)
	f.site.serve = func(w http.ResponseWriter, r *http.Request) bool {
		if r.URL.Path != "/v1/messages" {
			return false
		}
		if ae := r.Header.Get("Accept-Encoding"); ae != "" {
			http.Error(w, "the gateway let Accept-Encoding "+ae+" through", 500)
			return true
		}
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		first, rest, _ := strings.Cut(messagesStream(r.Header.Get("X-Api-Key")), "event: content_block_start")
		io.WriteString(w, first)
		http.NewResponseController(w).Flush()
		select {
		case <-release:
			released <- true
		case <-time.After(10 * time.Second):
			released <- false
		}
		io.WriteString(w, "event: content_block_start"+rest)
		return true
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Certificate())
	body := `{"model":"claude-asked","stream":true,"messages":[{"role":"user","content":"run the tests"}]}`
	for _, host := range []string{"a.test", "b.test"} {
		c, err := net.Dial("tcp4", fmt.Sprintf("127.0.0.1:%d", f.port))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(15 * time.Second))
		tc := tls.Client(c, &tls.Config{ServerName: host, RootCAs: roots})
		key := ""
		if host == "b.test" {
			// Its key is injected: the agent holds the placeholder.
			key = "X-Api-Key: " + placeholder + "\r\n"
		}
		fmt.Fprintf(tc, "POST /v1/messages HTTP/1.1\r\nHost: %s\r\nUser-Agent: test-cli/1.0\r\nAccept-Encoding: gzip\r\n%sContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
			host, key, len(body), body)
		resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("%s: %v %v", host, resp, err)
		}
		br := bufio.NewReader(resp.Body)
		var got strings.Builder
		for !strings.Contains(got.String(), "message_start") {
			l, err := br.ReadString('\n')
			got.WriteString(l)
			if err != nil {
				t.Fatalf("%s: the stream's first event did not come before the rest: %q, %v", host, got.String(), err)
			}
		}
		release <- struct{}{}
		if !<-released {
			t.Fatalf("%s: the origin was not released", host)
		}
		b, _ := io.ReadAll(br)
		got.Write(b)
		echoed := ""
		if host == "b.test" {
			// The origin echoed the secret: the agent reads the
			// placeholder (cut to the secret's length, as a body's
			// replacement keeps its length).
			echoed = placeholder[:len("s3cret-value")]
		}
		if want := messagesStream(echoed); got.String() != want {
			t.Fatalf("%s: the agent got\n%q\nwant\n%q", host, got.String(), want)
		}
		e := f.event(t)
		m := e.Model
		if e.Kind != Request || e.Status != 200 || m == nil {
			t.Fatalf("%s: event %+v", host, e)
		}
		sum := sha256.Sum256([]byte(body))
		want := modelapi.Request{Model: "claude-asked", Stream: true, Digest: hex.EncodeToString(sum[:]), Bytes: int64(len(body))}
		if m.API != modelapi.Anthropic || m.Request != want || !m.Answered || m.FirstByte <= 0 || m.Application != "test-cli/1.0" {
			t.Fatalf("%s: call %+v", host, m)
		}
		r := m.Response
		input := `{"command":"curl -H 'x-api-key: ` + echoed + `' https://b.test/"}`
		if r.Model != "claude-answered" || r.StopReason != "tool_use" || r.Usage != (modelapi.Usage{Known: true, Prompt: 12, Completion: 30, Total: 42, Final: true}) ||
			len(r.ToolCalls) != 1 || r.ToolCalls[0] != (modelapi.ToolCall{ID: "toolu_1", Name: "Bash", Input: input}) || r.Problem != "" {
			t.Fatalf("%s: response %+v", host, r)
		}
		if strings.Contains(fmt.Sprintf("%+v", e), "s3cret") {
			t.Fatalf("%s: the secret is in the event: %+v", host, e)
		}
	}
}

// messagesStream is a Messages API stream whose tool call's input holds key.
func messagesStream(key string) string {
	return "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"model\":\"claude-answered\",\"usage\":{\"input_tokens\":12,\"output_tokens\":1}}}\n\n" +
		"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"Bash\",\"input\":{}}}\n\n" +
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"command\\\":\\\"curl -H 'x-api-key: " + key + "' https://b.test/\\\"}\"}}\n\n" +
		"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\"},\"usage\":{\"output_tokens\":30}}\n\n" +
		"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
}

// An origin that compresses though it was not asked to: the agent gets
// the body as identity, and the call is read.
func TestModelCallCompressedAnyway(t *testing.T) {
	ca, err := NewCA("sandbox-1", []string{"a.test"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	f := newFixtureWith(t, true, Config{CA: ca}, func(port int) netpolicy.Plan {
		pl, err := netpolicy.Compile(&policy.Profile{Network: policy.NetworkProfile{Egress: policy.EgressAllowlist, Allow: []policy.EgressRule{
			{Host: "a.test", Ports: []int{port}, API: "openai"}}}})
		if err != nil {
			t.Fatal(err)
		}
		return *pl
	})
	const answer = `{"object":"chat.completion","model":"gpt-x","choices":[{"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`
	f.site.serve = func(w http.ResponseWriter, r *http.Request) bool {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Encoding", "gzip")
		z := gzip.NewWriter(w)
		io.WriteString(z, answer)
		z.Close()
		return true
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Certificate())
	got := f.tlsDo(t, roots, "a.test", "POST /v1/chat/completions HTTP/1.1\r\nHost: a.test\r\nContent-Length: 17\r\n\r\n{\"model\":\"gpt-x\"}")
	if got != "200 "+answer {
		t.Fatalf("the agent got %q", got)
	}
	e := f.event(t)
	if e.Model == nil || e.Model.Response.Usage.Total != 4 || e.Model.Response.StopReason != "stop" || e.Model.Request.Model != "gpt-x" {
		t.Fatalf("event %+v", e.Model)
	}
}

// The model budget: calls are counted as they go and their tokens as
// their responses say; past a bound the client gets its vendor's 429
// (its own error shape, which the CLIs show), and a lower bound from a
// live tightening applies to the next call.
func TestModelBudget(t *testing.T) {
	ca, err := NewCA("sandbox-1", []string{"a.test", "b.test"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	var live atomic.Pointer[netpolicy.Plan]
	f := newFixtureWith(t, true, Config{CA: ca, Live: &live}, func(port int) netpolicy.Plan {
		pl, err := netpolicy.Compile(&policy.Profile{
			Network: policy.NetworkProfile{Egress: policy.EgressAllowlist, Allow: []policy.EgressRule{
				{Host: "a.test", Ports: []int{port}, API: "anthropic"}, {Host: "b.test", Ports: []int{port}, API: "openai"}}},
			Limits: policy.LimitsProfile{Model: policy.ModelBudget{Tokens: 100, MaxOutput: 40}},
		})
		if err != nil {
			t.Fatal(err)
		}
		return *pl
	})
	f.site.serve = func(w http.ResponseWriter, r *http.Request) bool {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, messagesStream(""))
		return true
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Certificate())
	post := func(host string) string {
		path := "/v1/messages"
		if host == "b.test" {
			path = "/v1/chat/completions"
		}
		return f.tlsDo(t, roots, host, "POST "+path+" HTTP/1.1\r\nHost: "+host+"\r\nContent-Length: 2\r\n\r\n{}")
	}
	// Each reserves 42 (2 bytes of input, the cap of 40 set on it) and
	// uses 42: the first two go (0, then 42 used), the third would pass
	// the budget.
	for i := 0; i < 2; i++ {
		if got := post("a.test"); !strings.HasPrefix(got, "200 ") {
			t.Fatalf("call %d: %q", i, got)
		}
		if e := f.event(t); e.Model == nil || e.Limit != "" {
			t.Fatalf("call %d: %+v", i, e)
		}
	}
	if u := f.gw.ModelUsage(); u != (ModelUsage{Tokens: 84, Requests: 2}) {
		t.Fatalf("usage %+v", u)
	}
	got := post("a.test")
	if !strings.HasPrefix(got, `429 {"error":{"message":"agentbox: this call would pass this sandbox's model budget: it reserves 42 tokens (its input's size and its output cap), and 16 of 100 are left (84 used, 0 reserved by calls in flight) (limits.model.tokens)","type":"rate_limit_error"},"type":"error"}`) {
		t.Fatalf("past the budget: %q", got)
	}
	e := f.event(t)
	if e.Kind != Refused || e.Limit != "model_tokens" || e.Status != 429 || e.Model != nil {
		t.Fatalf("refusal %+v", e)
	}
	// OpenAI's shape on its host.
	if got := post("b.test"); !strings.HasPrefix(got, `429 {"error":{"code":"insufficient_quota","message":"agentbox: `) {
		t.Fatalf("openai's 429: %q", got)
	}
	f.event(t)
	// A restored sandbox starts from its checkpoint's counts; a live
	// tightening to 3 calls a minute applies to the next call.
	f.gw.SetModelUsage(ModelUsage{})
	pl := *f.gw.plan()
	pl.Budget = policy.ModelBudget{Tokens: 100, MaxOutput: 40, RequestsPerMinute: 3} // 2 went this minute
	live.Store(&pl)
	if got := post("a.test"); !strings.HasPrefix(got, "200 ") {
		t.Fatalf("after the reset: %q", got)
	}
	f.event(t)
	resp, _, _ := f.tlsRoundTrip(t, roots, "a.test", "POST /v1/messages HTTP/1.1\r\nHost: a.test\r\nContent-Length: 2\r\n\r\n{}")
	if resp == nil || resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "60" {
		t.Fatalf("past the rate: %+v", resp)
	}
	if e := f.event(t); e.Limit != "model_requests_per_minute" {
		t.Fatalf("rate refusal %+v", e)
	}
}
