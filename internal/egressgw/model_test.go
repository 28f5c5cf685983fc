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
		first, rest, _ := strings.Cut(sseStream(r.Header.Get("X-Api-Key")), "event: content_block_start")
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
		if want := sseStream(echoed); got.String() != want {
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
		if r.Model != "claude-answered" || r.StopReason != "tool_use" || r.Usage != (modelapi.Usage{Known: true, Prompt: 12, Completion: 30, Total: 42}) ||
			len(r.ToolCalls) != 1 || r.ToolCalls[0] != (modelapi.ToolCall{ID: "toolu_1", Name: "Bash", Input: input}) || r.Problem != "" {
			t.Fatalf("%s: response %+v", host, r)
		}
		if strings.Contains(fmt.Sprintf("%+v", e), "s3cret") {
			t.Fatalf("%s: the secret is in the event: %+v", host, e)
		}
	}
}

// sseStream is a Messages API stream whose tool call's input holds key.
func sseStream(key string) string {
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
