package egressgw

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"agentbox.dev/agentbox/internal/netpolicy"
	"agentbox.dev/agentbox/internal/policy"
)

// budgetFixture: a.test speaks Anthropic, b.test OpenAI, under budget.
func budgetFixture(t *testing.T, budget policy.ModelBudget) (*fixture, *x509.CertPool) {
	ca, err := NewCA("sandbox-1", []string{"a.test", "b.test"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	f := newFixtureWith(t, true, Config{CA: ca}, func(port int) netpolicy.Plan {
		pl, err := netpolicy.Compile(&policy.Profile{
			Network: policy.NetworkProfile{Egress: policy.EgressAllowlist, Allow: []policy.EgressRule{
				{Host: "a.test", Ports: []int{port}, API: "anthropic", WebSocket: true}, {Host: "b.test", Ports: []int{port}, API: "openai"}}},
			Limits: policy.LimitsProfile{Model: budget},
		})
		if err != nil {
			t.Fatal(err)
		}
		return *pl
	})
	roots := x509.NewCertPool()
	roots.AddCert(ca.Certificate())
	return f, roots
}

func post(host, path, body string) string {
	return fmt.Sprintf("POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", path, host, len(body), body)
}

// A stream the agent cuts short, and a Chat Completions stream without
// usage, are charged their reservation (input and cap), not what was
// read; an honest stream is charged its final usage exactly.
func TestBudgetChargesWhatCannotBeRead(t *testing.T) {
	f, roots := budgetFixture(t, policy.ModelBudget{Tokens: 10000, MaxOutput: 400})
	var bodies sync.Map
	f.site.serve = func(w http.ResponseWriter, r *http.Request) bool {
		b, _ := io.ReadAll(r.Body)
		bodies.Store(r.URL.Path, string(b))
		w.Header().Set("Content-Type", "text/event-stream")
		if r.URL.Path == "/v1/chat/completions" {
			io.WriteString(w, "data: {\"object\":\"chat.completion.chunk\",\"choices\":[{\"delta\":{\"content\":\"hi\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n")
			return true
		}
		if strings.Contains(string(b), `"cut"`) {
			// The vendor's first event, then it writes on until the
			// agent has gone.
			rc := http.NewResponseController(w)
			io.WriteString(w, strings.SplitAfter(messagesStream(""), "\n\n")[0])
			for i := 0; i < 2000; i++ {
				if rc.Flush() != nil {
					break
				}
				io.WriteString(w, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"more\"}}\n\n")
				time.Sleep(2 * time.Millisecond)
			}
			return true
		}
		io.WriteString(w, messagesStream(""))
		return true
	}
	const msg = `{"model":"m","max_tokens":100,"stream":true}`
	// Honest: charged its final usage, 42.
	if got := f.tlsDo(t, roots, "a.test", post("a.test", "/v1/messages", msg)); !strings.HasPrefix(got, "200 ") {
		t.Fatalf("honest: %q", got)
	}
	if e := f.event(t); e.Model == nil || !e.Model.Budgeted || e.Model.Reserved != int64(len(msg))+100 || e.Model.Charged != 42 {
		t.Fatalf("honest: %+v", e.Model)
	}
	// Cut after its first event: charged its reservation.
	c := f.tlsConn(t, roots, "a.test")
	io.WriteString(c, post("a.test", "/v1/messages", strings.Replace(msg, `"m"`, `"cut"`, 1)))
	br := bufio.NewReader(c)
	if line, _ := br.ReadString('\n'); !strings.HasPrefix(line, "HTTP/1.1 200") {
		t.Fatalf("cut: %q", line)
	}
	for line := ""; !strings.HasPrefix(line, "data: "); line, _ = br.ReadString('\n') {
	}
	c.Close()
	if e := f.event(t); e.Model == nil || e.Model.Charged != int64(len(msg))+2+100 {
		t.Fatalf("cut: charged %+v", e.Model)
	}
	// Chat Completions with no usage in its stream, and no cap: the cap
	// of 400 is set on it, and it is charged input + 400.
	chat := `{"model":"g","stream":true,"messages":[]}`
	if got := f.tlsDo(t, roots, "b.test", post("b.test", "/v1/chat/completions", chat)); !strings.HasPrefix(got, "200 ") {
		t.Fatalf("chat: %q", got)
	}
	e := f.event(t)
	if e.Model == nil || e.Model.CapSet != 400 || e.Model.Charged != int64(len(chat))+400 {
		t.Fatalf("chat: %+v", e.Model)
	}
	if sent, _ := bodies.Load("/v1/chat/completions"); !strings.Contains(sent.(string), `"max_completion_tokens":400`) {
		t.Fatalf("the origin got %q, without the cap", sent)
	}
	if u := f.gw.ModelUsage(); u.Tokens != 42+int64(len(msg))+2+100+int64(len(chat))+400 {
		t.Fatalf("usage %+v", u)
	}
}

// tlsConn opens a TLS connection to the gateway for sni.
func (f *fixture) tlsConn(t *testing.T, roots *x509.CertPool, sni string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp4", fmt.Sprintf("127.0.0.1:%d", f.port))
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	return tls.Client(c, &tls.Config{ServerName: sni, RootCAs: roots})
}

// 20 calls at once against a budget that admits 2 in flight: 2 reach the
// vendor, 18 get the vendor's own 429, before any usage came back.
func TestBudgetBoundsCallsInFlight(t *testing.T) {
	const body = `{"model":"m","max_tokens":400}` // reserves 430
	f, roots := budgetFixture(t, policy.ModelBudget{Tokens: 1000, MaxOutput: 400})
	var reached atomic.Int32
	release := make(chan struct{})
	f.site.serve = func(w http.ResponseWriter, r *http.Request) bool {
		io.Copy(io.Discard, r.Body)
		reached.Add(1)
		<-release
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"type":"message","model":"m","stop_reason":"end_turn","usage":{"input_tokens":20,"output_tokens":400}}`)
		return true
	}
	var wg sync.WaitGroup
	codes := make(chan string, 20)
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got := f.tlsDo(t, roots, "a.test", post("a.test", "/v1/messages", body))
			codes <- got[:3]
		}()
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(codes) < 18 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	close(release)
	wg.Wait()
	close(codes)
	n := map[string]int{}
	for c := range codes {
		n[c]++
	}
	if n["200"] != 2 || n["429"] != 18 || reached.Load() != 2 {
		t.Fatalf("codes %v, the vendor reached %d times", n, reached.Load())
	}
	for i := 0; i < 20; i++ {
		f.event(t)
	}
	if u := f.gw.ModelUsage(); u.Tokens != 840 {
		t.Fatalf("usage %+v, want 2 × 420", u)
	}
}

// Under a token budget, what the gateway does not account for is refused
// with the vendor's own error shape, and never reaches it: a batch, a
// WebSocket, a method override, a body it cannot read; a token count goes.
func TestBudgetRefusesTheUnaccounted(t *testing.T) {
	f, roots := budgetFixture(t, policy.ModelBudget{Tokens: 10000})
	var reached atomic.Int32
	f.site.serve = func(w http.ResponseWriter, r *http.Request) bool {
		reached.Add(1)
		io.WriteString(w, `{"input_tokens":3}`)
		return true
	}
	for _, tc := range []struct{ host, req, want string }{
		{"a.test", post("a.test", "/v1/messages/batches", `{"requests":[]}`), `403 {"error":{"message":"agentbox: POST /v1/messages/batches is not served under a token budget`},
		{"b.test", post("b.test", "/v1/batches", `{}`), `403 {"error":{"code":"invalid_request_error","message":"agentbox: POST /v1/batches is not served`},
		{"a.test", "GET /v1/messages/batches/b1/results HTTP/1.1\r\nHost: a.test\r\n\r\n", `403 {"error":{"message":"agentbox: GET /v1/messages/batches/b1/results is not served`},
		{"a.test", "GET /api/ws HTTP/1.1\r\nHost: a.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n", `403 {"error":{"message":"agentbox: a WebSocket to a model host is not served`},
		{"a.test", strings.Replace(post("a.test", "/v1/models", `{}`), "\r\n\r\n", "\r\nX-HTTP-Method-Override: POST\r\n\r\n", 1), `403 `},
		{"a.test", strings.Replace(post("a.test", "/v1/messages/count_tokens", `{}`), "\r\n\r\n", "\r\nX-HTTP-Method-Override: GET\r\n\r\n", 1), `400 {"error":{"message":"agentbox: X-Http-Method-Override is not served`},
		{"a.test", post("a.test", "/v1/messages", `{"max_tokens":1,"max_tokens":99999}`), `400 {"error":{"message":"agentbox: the gateway cannot account for this call under a token budget (limits.model.tokens): the request body: max_tokens: named twice`},
		{"b.test", post("b.test", "/v1/responses", `{"background":true}`), `400 {"error":{"code":"invalid_request_error","message":"agentbox: the gateway cannot account for this call under a token budget (limits.model.tokens): background:`},
	} {
		if got := f.tlsDo(t, roots, tc.host, tc.req); !strings.HasPrefix(got, tc.want) {
			t.Errorf("%q: %q, want %q", tc.req, got, tc.want)
		}
		if e := f.event(t); e.Kind != Refused || e.Limit != "model_unaccounted" {
			t.Errorf("%q: event %v %q", tc.req, e.Kind, e.Limit)
		}
	}
	if n := reached.Load(); n != 0 {
		t.Fatalf("the vendor was reached %d times", n)
	}
	// The twin: counting tokens is free, and goes.
	if got := f.tlsDo(t, roots, "a.test", post("a.test", "/v1/messages/count_tokens", `{"messages":[]}`)); !strings.HasPrefix(got, "200 ") {
		t.Fatalf("count_tokens: %q", got)
	}
	if e := f.event(t); e.Model == nil || e.Model.Charged != 0 || e.Model.Endpoint.Name != "count_tokens" {
		t.Fatalf("count_tokens: %+v", e.Model)
	}
}
