package ingest

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	pb "gvisor.dev/gvisor/pkg/sentry/seccheck/points/points_go_proto"

	"agentbox.dev/agentbox/internal/audit"
)

func TestDecodeMessage(t *testing.T) {
	good := frame(pb.MessageType_MESSAGE_SYSCALL_OPEN, 3, &pb.Open{Pathname: "/etc/passwd"})
	bigHeader := append([]byte(nil), good...)
	binary.LittleEndian.PutUint16(bigHeader[0:], 500)
	cases := []struct {
		name string
		in   []byte
		want string
	}{
		{"good", good, ""},
		{"empty", nil, "shorter than the 8-byte header"},
		{"short", []byte{8, 0, 7}, "shorter than the 8-byte header"},
		{"header size beyond message", bigHeader, "header size 500"},
		{"header size too small", append([]byte{4, 0}, good[2:]...), "header size 4"},
		{"unknown type", frame(pb.MessageType(4242), 0, &pb.Open{}), "unknown message type 4242"},
		{"garbage payload", append(frame(pb.MessageType_MESSAGE_SYSCALL_CONNECT, 0, &pb.Connect{}), 0x0a, 0xff, 0xff, 0xff), "type MESSAGE_SYSCALL_CONNECT"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m, err := DecodeMessage(tc.in)
			if tc.want == "" {
				if err != nil || m.Dropped != 3 || m.Payload.(*pb.Open).Pathname != "/etc/passwd" {
					t.Fatalf("%+v %v", m, err)
				}
				return
			}
			if err == nil || !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("want %q, got %v", tc.want, err)
			}
		})
	}
}

func TestSockaddr(t *testing.T) {
	cases := []struct {
		in   []byte
		want audit.Endpoint
	}{
		{[]byte{2, 0, 0, 80, 127, 0, 0, 1}, audit.Endpoint{Family: "inet", IP: "127.0.0.1", Port: 80}},
		{[]byte{2, 0, 0, 80, 127}, audit.Endpoint{Family: "inet"}}, // short: no address
		{append([]byte{10, 0, 1, 187, 0, 0, 0, 0}, append(make([]byte, 15), 1)...), audit.Endpoint{Family: "inet6", IP: "::1", Port: 443}},
		{[]byte{1, 0, '/', 'r', 'u', 'n', 0, 'x'}, audit.Endpoint{Family: "unix", Path: "/run"}},
		{[]byte{1, 0, 0, 'a', 'b'}, audit.Endpoint{Family: "unix", Path: "@ab"}},
		{[]byte{99, 0}, audit.Endpoint{Family: "af_99"}},
	}
	for _, tc := range cases {
		if got := sockaddr(tc.in); got == nil || *got != tc.want {
			t.Errorf("%v: got %+v want %+v", tc.in, got, tc.want)
		}
	}
	if sockaddr([]byte{2}) != nil {
		t.Error("1 byte is no sockaddr")
	}
}

func TestRecordBounds(t *testing.T) {
	args := make([]string, 1000)
	for i := range args {
		args[i] = strings.Repeat("a", 10000)
	}
	s, _ := audit.NewScrubber(nil, nil)
	r := ToRecord(Message{Payload: &pb.ExecveInfo{Argv: args, BinaryPath: "/bin/\xff\xfe"}}, s)
	if len(r.Process.Argv) != maxArgs+1 || len(r.Process.Argv[0]) > maxStringLen+20 || !strings.Contains(r.Process.Argv[maxArgs], "744 more") {
		t.Fatalf("argv not bounded: %d entries", len(r.Process.Argv))
	}
	if line, _, _ := (&audit.Chain{}).Seal(r); !strings.Contains(string(line), `\ufffd`) || !utf8.Valid(line) {
		t.Fatalf("invalid UTF-8 must be replaced in the record: %q", line)
	}
}

func TestScrubber(t *testing.T) {
	s, err := audit.NewScrubber(func(n string) bool { return n == "PATH" || strings.HasPrefix(n, "AGENT_") }, []string{`(internal-)\w+`})
	if err != nil {
		t.Fatal(err)
	}
	argv := s.Args([]string{"curl", "--password=hunter2", "-H", "Authorization: Bearer eyJabc.def", "AKIAABCDEFGHIJKLMNOP", "https://bob:pw@host/x", "internal-codename", "ghp_abcdefghijklmnopqrstuvwxyz123456"})
	joined := strings.Join(argv, " ")
	for _, secret := range []string{"hunter2", "eyJabc.def", "AKIAABCDEFGHIJKLMNOP", ":pw@", "codename", "ghp_abc"} {
		if strings.Contains(joined, secret) {
			t.Errorf("%q survived: %s", secret, joined)
		}
	}
	if !strings.Contains(joined, "--password=<redacted>") || !strings.Contains(joined, "https://bob:<redacted>@host/x") || !strings.Contains(joined, "internal-<redacted>") {
		t.Errorf("redaction keeps context: %s", joined)
	}
	env := s.Env([]string{"PATH=/bin", "AGENT_TOKEN=token=abc", "HOME=/root", "BROKEN"})
	if strings.Join(env, " ") != "PATH=/bin AGENT_TOKEN=<redacted> HOME=<dropped> BROKEN=<dropped>" {
		t.Errorf("env: %v", env)
	}
	if _, err := audit.NewScrubber(nil, []string{"("}); err == nil {
		t.Error("a bad pattern must be an error")
	}
}

// TestPodInitConfigValidatesAgainstGVisor: every trace session the shim
// can ask for (all eight combinations of a role's audit switches) names
// only points and fields gVisor has, so runsc never boots one unaudited.
func TestPodInitConfigValidatesAgainstGVisor(t *testing.T) {
	for i := 0; i < 8; i++ {
		p := audit.Points{Process: i&1 != 0, File: i&2 != 0, Network: i&4 != 0}
		if err := validatePoints(PointNames(p)); err != nil {
			t.Fatalf("%+v: %v", p, err)
		}
		if _, err := PodInitConfig(p, "/run/x.sock", 10, 4<<20); err != nil {
			t.Fatalf("%+v: %v", p, err)
		}
	}
	// The sink's send buffer reaches runsc's remote sink config (agentbox's
	// patch reads "send_buffer"); 0 leaves the key out (the kernel's default).
	for _, c := range []struct {
		buf  int
		want any
	}{{4 << 20, float64(4 << 20)}, {0, nil}} {
		b, err := PodInitConfig(audit.Points{File: true}, "/run/x.sock", 10, c.buf)
		if err != nil {
			t.Fatal(err)
		}
		var cfg struct {
			TraceSession struct {
				Sinks []struct {
					Name   string         `json:"name"`
					Config map[string]any `json:"config"`
				} `json:"sinks"`
			} `json:"trace_session"`
		}
		if err := json.Unmarshal(b, &cfg); err != nil || len(cfg.TraceSession.Sinks) != 1 {
			t.Fatalf("%s: %v", b, err)
		}
		sink := cfg.TraceSession.Sinks[0]
		if sink.Name != "remote" || sink.Config["endpoint"] != "/run/x.sock" || sink.Config["retries"] != float64(10) || sink.Config["send_buffer"] != c.want {
			t.Fatalf("send buffer %d: sink %+v", c.buf, sink)
		}
	}
	bad := []pointConfig{{Name: "syscall/open/exit", OptionalFields: []string{"fd_path"}}}
	if err := validatePoints(bad); err == nil || !strings.Contains(err.Error(), "no optional field \"fd_path\"") {
		t.Fatalf("runsc would boot this session unaudited; it must be refused: %v", err)
	}
	if err := validatePoints([]pointConfig{{Name: "syscall/nope/exit"}}); err == nil {
		t.Fatal("unknown point accepted")
	}
}

// FuzzDecode: arbitrary bytes from the sandbox never panic the decoder or
// the record mapping, and what maps encodes as a sealed line.
//
//	go test ./internal/audit -run '^$' -fuzz FuzzDecode -fuzztime 60s
func FuzzDecode(f *testing.F) {
	cd := &pb.ContextData{TimeNs: 1, ThreadId: 1, ThreadGroupId: 1, Cwd: "/", ContainerId: "c"}
	f.Add(frame(pb.MessageType_MESSAGE_SYSCALL_OPEN, 0, &pb.Open{ContextData: cd, Pathname: "x", Exit: &pb.Exit{Result: 3}}))
	f.Add(frame(pb.MessageType_MESSAGE_SYSCALL_CONNECT, 1, &pb.Connect{ContextData: cd, Address: []byte{2, 0, 0, 80, 1, 2, 3, 4}, Exit: &pb.Exit{Errorno: 111}}))
	f.Add(frame(pb.MessageType_MESSAGE_SENTRY_EXEC, 0, &pb.ExecveInfo{ContextData: cd, Argv: []string{"a", "token=x"}, Env: []string{"A=b"}}))
	f.Add(frame(pb.MessageType_MESSAGE_CONTAINER_START, 0, &pb.Start{ContextData: cd, Args: []string{"sh"}}))
	f.Add(frame(pb.MessageType_MESSAGE_SENTRY_TASK_EXIT, 0, &pb.TaskExit{ContextData: cd, ExitStatus: 9}))
	f.Add(frame(pb.MessageType_MESSAGE_SYSCALL_ACCEPT, 0, &pb.Accept{ContextData: cd, Address: []byte{1, 0, 0}}))
	f.Add([]byte{8, 0, 7, 0, 0, 0, 0, 0})
	scrub, _ := audit.NewScrubber(func(string) bool { return false }, nil)
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeMessage(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error not marked malformed: %v", err)
			}
			return
		}
		r := ToRecord(m, scrub)
		if r == nil {
			return
		}
		var c audit.Chain
		if _, _, err := c.Seal(r); err != nil {
			t.Fatalf("a decoded record does not encode: %v", err)
		}
	})
}

// TestConnectInProgress: a non-blocking connect's EINPROGRESS is what every
// TCP client gets, not a failure; a refused connect still is one.
func TestConnectInProgress(t *testing.T) {
	addr := []byte{2, 0, 1, 187, 10, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0}
	for _, tc := range []struct {
		errno  int64
		status string
	}{{115, "Success"}, {111, "Failure"}, {0, "Success"}} {
		m, err := DecodeMessage(frame(pb.MessageType_MESSAGE_SYSCALL_CONNECT, 0, &pb.Connect{Exit: &pb.Exit{Errorno: tc.errno}, Address: addr}))
		if err != nil {
			t.Fatal(err)
		}
		r := ToRecord(m, nil)
		if r.Status != tc.status || r.Errno != tc.errno || (tc.errno == 115) != (r.Detail["connect"] != "") {
			t.Errorf("errno %d: status %s errno %d detail %v", tc.errno, r.Status, r.Errno, r.Detail)
		}
	}
}

// withLocalAddress adds the local address as agentbox's runsc patch does:
// an unknown field of the Connect message.
func withLocalAddress(p *pb.Connect, sockaddr []byte) *pb.Connect {
	m := p.ProtoReflect()
	raw := protowire.AppendTag(m.GetUnknown(), ConnectLocalAddressField, protowire.BytesType)
	m.SetUnknown(protowire.AppendBytes(raw, sockaddr))
	return p
}

// TestConnectLocalAddress: the patched Sentry's local address becomes the
// record's source; a stock runsc's message (none), another unknown field
// before it, and malformed bytes from the sandbox are each handled, never
// a crash and never a made-up address.
func TestConnectLocalAddress(t *testing.T) {
	dst := []byte{2, 0, 1, 187, 169, 254, 53, 53, 0, 0, 0, 0, 0, 0, 0, 0}
	local := []byte{2, 0, 0xa4, 0x5b, 10, 88, 0, 7, 0, 0, 0, 0, 0, 0, 0, 0} // 10.88.0.7:42075
	other := func(p *pb.Connect) *pb.Connect {
		m := p.ProtoReflect()
		m.SetUnknown(protowire.AppendVarint(protowire.AppendTag(m.GetUnknown(), 4000, protowire.VarintType), 9))
		return p
	}
	raw := func(b ...byte) func(p *pb.Connect) *pb.Connect {
		return func(p *pb.Connect) *pb.Connect { p.ProtoReflect().SetUnknown(b); return p }
	}
	for _, tc := range []struct {
		name string
		msg  *pb.Connect
		want *audit.Endpoint
	}{
		{"patched", withLocalAddress(&pb.Connect{Exit: &pb.Exit{Errorno: 115}, Address: dst}, local), &audit.Endpoint{Family: "inet", IP: "10.88.0.7", Port: 42075}},
		{"stock runsc", &pb.Connect{Exit: &pb.Exit{Errorno: 115}, Address: dst}, nil},
		{"after another field", withLocalAddress(other(&pb.Connect{Address: dst}), local), &audit.Endpoint{Family: "inet", IP: "10.88.0.7", Port: 42075}},
		{"wrong wire type", raw(0xc8, 0xb8, 0x02, 0x01)(&pb.Connect{Address: dst}), nil}, // field 5001, varint 1
		{"truncated length", raw(0xca, 0xb8, 0x02, 0x7f, 2, 0)(&pb.Connect{Address: dst}), nil},
		{"short sockaddr", withLocalAddress(&pb.Connect{Address: dst}, []byte{2}), nil},
		{"unnamed unix socket", withLocalAddress(&pb.Connect{Address: dst}, []byte{1, 0}), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := frame(pb.MessageType_MESSAGE_SYSCALL_CONNECT, 0, tc.msg)
			m, err := DecodeMessage(b)
			if err != nil {
				// A malformed unknown field may fail the whole message:
				// then it is an anomaly, not a record.
				if tc.want != nil {
					t.Fatal(err)
				}
				return
			}
			r := ToRecord(m, nil)
			if fmt.Sprint(r.Src) != fmt.Sprint(tc.want) {
				t.Fatalf("src %+v, want %+v", r.Src, tc.want)
			}
			if r.Dst == nil || r.Dst.IP != "169.254.53.53" || r.Dst.Port != 443 {
				t.Fatalf("dst %+v", r.Dst)
			}
		})
	}
}
