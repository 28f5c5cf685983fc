package ingest

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	pb "gvisor.dev/gvisor/pkg/sentry/seccheck/points/points_go_proto"
	"gvisor.dev/gvisor/pkg/sentry/seccheck/sinks/remote/wire"

	"agentbox.dev/agentbox/internal/audit"
)

// Bounds on what one record may carry from the sandbox.
const (
	MaxMessageSize = 1 << 20
	maxArgs        = 256
	maxStringLen   = 4096
)

// Message is one decoded message from the sandbox.
type Message struct {
	Type    pb.MessageType
	Dropped uint32
	Payload proto.Message
}

// ErrMalformed wraps every reason a message from the sandbox is rejected.
var ErrMalformed = errors.New("malformed message")

// DecodeMessage parses one message: an 8-byte little-endian header (header
// size, message type, cumulative dropped count) and a protobuf payload. The
// input is untrusted: every length is checked.
func DecodeMessage(buf []byte) (Message, error) {
	return decodeInto(buf, newPayload)
}

// Decoder decodes messages reusing one payload per message type: a
// payload is valid only until the next Decode. Not safe for concurrent use.
type Decoder struct {
	cache map[pb.MessageType]proto.Message
}

// Decode is DecodeMessage without allocating a payload per message.
func (d *Decoder) Decode(buf []byte) (Message, error) {
	return decodeInto(buf, func(t pb.MessageType) proto.Message {
		if m, ok := d.cache[t]; ok {
			return m
		}
		m := newPayload(t)
		if m != nil {
			if d.cache == nil {
				d.cache = map[pb.MessageType]proto.Message{}
			}
			d.cache[t] = m
		}
		return m
	})
}

func decodeInto(buf []byte, payloadFor func(pb.MessageType) proto.Message) (Message, error) {
	if len(buf) < wire.HeaderStructSize {
		return Message{}, fmt.Errorf("%w: %d bytes, shorter than the %d-byte header", ErrMalformed, len(buf), wire.HeaderStructSize)
	}
	hsize := int(binary.LittleEndian.Uint16(buf[0:2]))
	m := Message{
		Type:    pb.MessageType(binary.LittleEndian.Uint16(buf[2:4])),
		Dropped: binary.LittleEndian.Uint32(buf[4:8]),
	}
	if hsize < wire.HeaderStructSize || hsize > len(buf) {
		return m, fmt.Errorf("%w: header size %d outside [%d, %d]", ErrMalformed, hsize, wire.HeaderStructSize, len(buf))
	}
	payload := payloadFor(m.Type)
	if payload == nil {
		return m, fmt.Errorf("%w: unknown message type %d", ErrMalformed, m.Type)
	}
	if err := proto.Unmarshal(buf[hsize:], payload); err != nil {
		return m, fmt.Errorf("%w: type %s: %v", ErrMalformed, m.Type, err)
	}
	m.Payload = payload
	return m, nil
}

func newPayload(t pb.MessageType) proto.Message {
	switch t {
	case pb.MessageType_MESSAGE_CONTAINER_START:
		return &pb.Start{}
	case pb.MessageType_MESSAGE_SENTRY_CLONE:
		return &pb.CloneInfo{}
	case pb.MessageType_MESSAGE_SENTRY_EXEC:
		return &pb.ExecveInfo{}
	case pb.MessageType_MESSAGE_SENTRY_TASK_EXIT:
		return &pb.TaskExit{}
	case pb.MessageType_MESSAGE_SYSCALL_OPEN:
		return &pb.Open{}
	case pb.MessageType_MESSAGE_SYSCALL_EXECVE:
		return &pb.Execve{}
	case pb.MessageType_MESSAGE_SYSCALL_CHDIR:
		return &pb.Chdir{}
	case pb.MessageType_MESSAGE_SYSCALL_SOCKET:
		return &pb.Socket{}
	case pb.MessageType_MESSAGE_SYSCALL_CONNECT:
		return &pb.Connect{}
	case pb.MessageType_MESSAGE_SYSCALL_BIND:
		return &pb.Bind{}
	case pb.MessageType_MESSAGE_SYSCALL_LISTEN:
		return &pb.Listen{}
	case pb.MessageType_MESSAGE_SYSCALL_ACCEPT:
		return &pb.Accept{}
	}
	return nil
}

// Scrubber removes secrets from what a record carries.
type Scrubber interface {
	Env(env []string) []string
	Args(argv []string) []string
}

// ToRecord maps a decoded payload to a record, scrubbed. It returns nil for
// payloads that are deliberately not recorded (thread exits).
func ToRecord(m Message, s Scrubber) *audit.Record {
	switch p := m.Payload.(type) {
	case *pb.Start:
		_, r := base(p.GetContextData(), audit.ClassProcess, 1, "Launch", "container/start")
		r.Process.Argv = s.Args(clipList(p.GetArgs()))
		r.Process.Env = s.Env(clipList(p.GetEnv()))
		r.Process.Cwd = clip(p.GetCwd())
		r.Container = clip(p.GetId())
		return r
	case *pb.ExecveInfo:
		_, r := base(p.GetContextData(), audit.ClassProcess, 1, "Launch", "sentry/execve")
		r.Process.Exe = clip(p.GetBinaryPath())
		r.Process.Argv = s.Args(clipList(p.GetArgv()))
		r.Process.Env = s.Env(clipList(p.GetEnv()))
		r.Status = "Success"
		return r
	case *pb.Execve:
		if m, ok := mutations[p.GetSysno()]; ok && m.twoPaths {
			return twoPathRecord(p, m)
		}
		e, r := base(p.GetContextData(), audit.ClassProcess, 1, "Launch", "syscall/execve")
		e.setResult(p.GetExit())
		if r.Status == "Success" {
			return nil // sentry/execve records the new image
		}
		r.File = &audit.File{Path: resolve(p.GetFdPath(), p.GetPathname(), r.Process.Cwd)}
		r.Process.Argv = s.Args(clipList(p.GetArgv()))
		r.Process.Env = s.Env(clipList(p.GetEnvv()))
		return r
	case *pb.CloneInfo:
		_, r := base(p.GetContextData(), audit.ClassProcess, 1, "Launch", "sentry/clone")
		r.Process.ChildPID = p.GetCreatedThreadGroupId()
		if p.GetFlags()&0x10000 != 0 { // CLONE_THREAD: a thread, not a process
			return nil
		}
		r.Status = "Success"
		return r
	case *pb.TaskExit:
		cd := p.GetContextData()
		if cd != nil && cd.GetThreadId() != cd.GetThreadGroupId() {
			return nil // a thread, not the process
		}
		_, r := base(cd, audit.ClassProcess, 2, "Terminate", "sentry/task_exit")
		// A wait status: the exit code in bits 8-15, or the signal in 0-6.
		if ws := p.GetExitStatus(); ws&0x7f == 0 {
			code := (ws >> 8) & 0xff
			r.Process.ExitSts = &code
		} else {
			sig := ws & 0x7f
			r.Process.ExitSignal = &sig
		}
		return r
	case *pb.Open:
		if m, ok := mutations[p.GetSysno()]; ok && !m.twoPaths {
			return onePathRecord(p, m)
		}
		e, r := base(p.GetContextData(), audit.ClassFileSystem, 14, "Open", "syscall/"+syscallName(p.GetSysno(), "open"))
		e.setResult(p.GetExit())
		f := &e.file
		*f = audit.File{Path: resolve(p.GetFdPath(), p.GetPathname(), r.Process.Cwd), Flags: openFlags(p.GetFlags()), Mode: p.GetMode()}
		r.File = f
		return r
	case *pb.Chdir:
		e, r := base(p.GetContextData(), audit.ClassFileSystem, 99, "Chdir", "syscall/"+syscallName(p.GetSysno(), "chdir"))
		e.setResult(p.GetExit())
		r.File = &audit.File{Path: resolve(p.GetFdPath(), p.GetPathname(), r.Process.Cwd)}
		return r
	case *pb.Socket:
		e, r := base(p.GetContextData(), audit.ClassNetwork, 1, "Open", "syscall/socket")
		e.setResult(p.GetExit())
		r.Dst = &audit.Endpoint{Family: family(uint16(p.GetDomain())), Type: sockType(p.GetType())}
		return r
	case *pb.Connect:
		r := addressed(p, 1, "Open", "syscall/connect")
		if src := sockaddr(localAddress(p)); src != nil && src.IP != "" {
			r.Src = src // an IP socket's local address (a unix one's says nothing)
		}
		if r.Errno == einprogress {
			// A non-blocking connect under way: what every TCP client
			// does, not a failure. Its outcome is the socket's, later.
			r.Status = "Success"
			r.Detail = map[string]string{"connect": "in progress (non-blocking)"}
		}
		return r
	case *pb.Bind:
		return addressed(p, 99, "Bind", "syscall/bind")
	case *pb.Listen:
		return addressed(p, 7, "Listen", "syscall/listen")
	case *pb.Accept:
		return addressed(p, 99, "Accept", "syscall/"+syscallName(p.GetSysno(), "accept"))
	}
	return nil
}

// ConnectLocalAddressField is the field of a Connect message that
// agentbox's runsc patch (hack/patches/runsc-connect-local-address.patch)
// adds beyond gVisor's points.proto: the socket's local address once the
// connect has started, whose port is what a peer outside the sandbox sees.
const ConnectLocalAddressField = 5001

// localAddress is the Connect's ConnectLocalAddressField, or nil: a stock
// runsc, or a field that does not parse (the sandbox's bytes).
func localAddress(m proto.Message) []byte {
	b := m.ProtoReflect().GetUnknown()
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil
		}
		b = b[n:]
		if num == ConnectLocalAddressField && typ == protowire.BytesType {
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return nil
			}
			return v
		}
		if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
			return nil
		}
		b = b[n:]
	}
	return nil
}

// einprogress is EINPROGRESS: a non-blocking connect that has started.
const einprogress = 115

// eventRecord is a record of a sandbox event with its parts, allocated in
// one piece (the receiver's hot path).
type eventRecord struct {
	rec      audit.Record
	proc     audit.Process
	file     audit.File
	uid, gid uint32
	result   int64
}

// addressedSyscall is a network syscall that carries a socket address.
type addressedSyscall interface {
	GetContextData() *pb.ContextData
	GetExit() *pb.Exit
	GetAddress() []byte
}

func addressed(p addressedSyscall, activity int, name, event string) *audit.Record {
	e, r := base(p.GetContextData(), audit.ClassNetwork, activity, name, event)
	e.setResult(p.GetExit())
	r.Dst = sockaddr(p.GetAddress())
	return r
}

func base(cd *pb.ContextData, class, activity int, name, event string) (*eventRecord, *audit.Record) {
	t := time.Now()
	if ns := cd.GetTimeNs(); ns > 0 {
		t = time.Unix(0, ns)
	}
	e := &eventRecord{
		rec: *audit.NewRecord(t, class, activity, name, event),
		proc: audit.Process{
			PID:  cd.GetThreadGroupId(),
			TID:  cd.GetThreadId(),
			PPID: cd.GetParentThreadGroupId(),
			Name: clip(cd.GetProcessName()),
			Cwd:  clip(cd.GetCwd()),
		},
	}
	r := &e.rec
	r.Process = &e.proc
	if c := cd.GetCredentials(); c != nil {
		e.uid, e.gid = c.GetEffectiveUid(), c.GetEffectiveGid()
		e.proc.UID, e.proc.GID = &e.uid, &e.gid
	}
	r.Container = clip(cd.GetContainerId())
	return e, r
}

// setResult records a syscall's outcome.
func (e *eventRecord) setResult(x *pb.Exit) {
	if x == nil {
		return
	}
	r := &e.rec
	if x.GetErrorno() != 0 {
		r.Status, r.Errno = "Failure", x.GetErrorno()
		return
	}
	r.Status = "Success"
	e.result = x.GetResult()
	r.Result = &e.result
}
