package audit

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// wireRecord is the part of an OCSF record ParseLine reads back: what
// appendOCSF wrote from a Record. Everything else a record carries is
// derived from these.
type wireRecord struct {
	TimeDT       string `json:"time_dt"`
	ClassUID     int    `json:"class_uid"`
	ClassName    string `json:"class_name"`
	ActivityID   int    `json:"activity_id"`
	ActivityName string `json:"activity_name"`
	SeverityID   int    `json:"severity_id"`
	Status       string `json:"status"`
	Message      string `json:"message"`
	Metadata     struct {
		Sequence  uint64 `json:"sequence"`
		EventCode string `json:"event_code"`
	} `json:"metadata"`
	Policy struct {
		Name string `json:"name"`
		UID  string `json:"uid"`
	} `json:"policy"`
	Actor struct {
		Process *wireProcess `json:"process"`
	} `json:"actor"`
	Process    *wireProcess `json:"process"`
	ExitCode   *int32       `json:"exit_code"`
	File       *wireFile    `json:"file"`
	FileResult *wireFile    `json:"file_result"`
	AIModel    *struct {
		Name     string `json:"name"`
		Provider string `json:"ai_provider"`
	} `json:"ai_model"`
	MessageContext *struct {
		Application struct {
			Name string `json:"name"`
		} `json:"application"`
		Prompt     *int64 `json:"prompt_tokens"`
		Completion *int64 `json:"completion_tokens"`
		Total      *int64 `json:"total_tokens"`
	} `json:"message_context"`
	Unmapped struct {
		Sandbox      string            `json:"sandbox_id"`
		Container    string            `json:"container_id"`
		Namespace    string            `json:"namespace"`
		PodNamespace string            `json:"pod_namespace"`
		PodName      string            `json:"pod_name"`
		Claim        *Claim            `json:"claim"`
		WarmPool     string            `json:"warm_pool"`
		Role         string            `json:"role"`
		PolicyDigest string            `json:"policy_digest"`
		Errno        int64             `json:"errno"`
		Result       *int64            `json:"result"`
		ChildPID     int32             `json:"child_pid"`
		ExitSignal   *int32            `json:"exit_signal"`
		ExitStatus   *int32            `json:"exit_status"`
		Status       string            `json:"status"`
		GID          *uint32           `json:"gid"`
		Argv         []string          `json:"argv"`
		FileFlags    string            `json:"file_flags"`
		FileMode     uint32            `json:"file_mode"`
		TargetMode   uint32            `json:"target_mode"`
		Dst          *Endpoint         `json:"dst"`
		Src          *Endpoint         `json:"src"`
		Counts       map[string]uint64 `json:"counts"`
		Detail       map[string]string `json:"detail"`
		Model        *ModelCall        `json:"model"`
		MCP          *MCPCall          `json:"mcp"`
	} `json:"unmapped"`
	Attestations []wireAttestation `json:"attestation_list"`
}

// wireAttestation is what a record's attestation says of the chain: the
// chain and the previous record's fingerprint (a record's own fingerprint
// is split off the line before it is parsed).
type wireAttestation struct {
	ChainUID  string `json:"chain_uid"`
	PrevEvent *struct {
		Fingerprint struct {
			Value string `json:"value"`
		} `json:"fingerprint"`
	} `json:"prev_event"`
}

type wireProcess struct {
	PID  int32  `json:"pid"`
	TID  int32  `json:"tid"`
	Name string `json:"name"`
	File *struct {
		Path string `json:"path"`
	} `json:"file"`
	Cwd  string `json:"working_directory"`
	User *struct {
		UID string `json:"uid"`
	} `json:"user"`
	Parent *struct {
		PID int32 `json:"pid"`
	} `json:"parent_process"`
	Env []struct {
		Name  string `json:"name"`
		Value string `json:"value"`
	} `json:"environment_variables"`
}

type wireFile struct {
	Path string `json:"path"`
}

// IsOCSF tells an OCSF line (this format) from a trail written before it
// (agentbox's own flat records, "hash" last).
func IsOCSF(line []byte) bool {
	return bytes.HasSuffix(bytes.TrimRight(line, "\r\n"), []byte(fingerprintSuffix))
}

// ParseLine reads one line of a trail, in either format, into a Record.
func ParseLine(line []byte) (*Record, error) {
	line = bytes.TrimRight(line, "\r\n")
	if !IsOCSF(line) {
		var r Record
		if err := json.Unmarshal(line, &r); err != nil {
			return nil, err
		}
		if r.Event == "" {
			return nil, fmt.Errorf("not an audit record")
		}
		return &r, nil
	}
	var w wireRecord
	if err := json.Unmarshal(line, &w); err != nil {
		return nil, err
	}
	u := &w.Unmapped
	r := &Record{
		Time: w.TimeDT, ClassUID: w.ClassUID, ClassName: w.ClassName, ActivityID: w.ActivityID, ActivityName: w.ActivityName,
		Status: w.Status, Errno: u.Errno, Result: u.Result, Message: w.Message, Event: w.Metadata.EventCode,
		Counts: u.Counts, Detail: u.Detail, Container: u.Container, Namespace: u.Namespace,
		PodNamespace: u.PodNamespace, PodName: u.PodName, Role: w.Policy.Name, PolicyDigest: w.Policy.UID, Seq: w.Metadata.Sequence,
		Dst: u.Dst, Src: u.Src, Claim: u.Claim, WarmPool: u.WarmPool,
	}
	if w.ClassUID == ClassDetectionFinding {
		r.Status = u.Status
	}
	if w.SeverityID != SeverityInformational {
		r.Severity = w.SeverityID
	}
	if w.ClassUID == ClassHTTP {
		// The activity follows the method; the record's own is Other.
		r.ActivityID, r.ActivityName = 99, typeByName[r.Event].Activity
	}
	if len(w.Attestations) == 1 {
		r.Sandbox = w.Attestations[0].ChainUID
		if pe := w.Attestations[0].PrevEvent; pe != nil {
			r.PrevHash = pe.Fingerprint.Value
		}
	}
	if p := w.Actor.Process; p != nil {
		r.Process = p.record()
		// On a record of the shim's own, the process it was joined to.
		r.joined = strings.HasPrefix(r.Event, "agentbox/")
	} else if len(u.Argv) > 0 || w.ExitCode != nil {
		r.Process = &Process{}
	}
	if r.Process != nil {
		r.Process.Argv = u.Argv
		r.Process.ChildPID = u.ChildPID
		r.Process.ExitSts = w.ExitCode
		if w.ExitCode == nil {
			r.Process.ExitSts = u.ExitStatus
		}
		r.Process.ExitSignal = u.ExitSignal
		r.Process.GID = u.GID
	}
	if w.ClassUID == ClassProcess && w.Process != nil && w.Process.File != nil {
		w.File = &wireFile{Path: w.Process.File.Path}
	}
	if w.File != nil {
		r.File = &File{Path: w.File.Path, Flags: u.FileFlags, Mode: u.FileMode}
	}
	if w.FileResult != nil {
		r.Target = &File{Path: w.FileResult.Path, Mode: u.TargetMode}
	}
	if m := u.Model; m != nil {
		r.Model = m
		if a := w.AIModel; a != nil {
			m.Name, m.Provider = unknownToEmpty(a.Name), unknownToEmpty(a.Provider)
		}
		if c := w.MessageContext; c != nil {
			m.Application = unknownToEmpty(c.Application.Name)
			if c.Prompt != nil && c.Completion != nil && c.Total != nil {
				m.Tokens = &Tokens{Prompt: *c.Prompt, Completion: *c.Completion, Total: *c.Total}
			}
		}
	}
	r.MCP = u.MCP
	return r, nil
}

func (p *wireProcess) record() *Process {
	out := &Process{PID: p.PID, TID: p.TID, Name: p.Name, Cwd: p.Cwd}
	if p.File != nil {
		out.Exe = p.File.Path
	}
	if p.User != nil {
		if n, err := strconv.ParseUint(p.User.UID, 10, 32); err == nil {
			uid := uint32(n)
			out.UID = &uid
		}
	}
	if p.Parent != nil {
		out.PPID = p.Parent.PID
	}
	for _, kv := range p.Env {
		out.Env = append(out.Env, kv.Name+"="+kv.Value)
	}
	return out
}

// chainFields are what the verifier needs of a line: its body (what the
// hash covers), the hash it states, and where it sits in the chain.
type chainFields struct {
	body    []byte
	hash    string
	seq     uint64
	prev    string
	sandbox string
	event   string
	counts  map[string]uint64
	// detail is read for the records that link trails (checkpointed,
	// restored).
	detail   map[string]string
	badShape string // set when the line is not a record of either format
}

// splitChain reads a line's chain fields, in either format.
func splitChain(line []byte) chainFields {
	var c chainFields
	if IsOCSF(line) {
		i := bytes.LastIndex(line, []byte(fingerprintPrefix))
		hash := line[i+len(fingerprintPrefix) : len(line)-len(fingerprintSuffix)]
		if i < 0 || len(hash) != 64 || strings.Trim(string(hash), "0123456789abcdef") != "" {
			c.badShape = "no hash (its attestation's fingerprint): the record was modified or cut"
			return c
		}
		c.hash = string(hash)
		c.body = append(append([]byte(nil), line[:i]...), attestationEnd...)
		var w struct {
			Metadata struct {
				Sequence  *uint64 `json:"sequence"`
				EventCode string  `json:"event_code"`
			} `json:"metadata"`
			Unmapped struct {
				Counts map[string]uint64 `json:"counts"`
				Detail map[string]string `json:"detail"`
			} `json:"unmapped"`
			Attestations []wireAttestation `json:"attestation_list"`
		}
		if err := json.Unmarshal(c.body, &w); err != nil || w.Metadata.Sequence == nil || len(w.Attestations) != 1 {
			c.badShape = "not an audit record: the record was modified"
			return c
		}
		c.seq = *w.Metadata.Sequence
		c.sandbox, c.event, c.counts, c.detail = w.Attestations[0].ChainUID, w.Metadata.EventCode, w.Unmapped.Counts, w.Unmapped.Detail
		if pe := w.Attestations[0].PrevEvent; pe != nil {
			c.prev = pe.Fingerprint.Value
		}
		return c
	}
	m := hashSuffix.FindSubmatchIndex(line)
	if m == nil {
		c.badShape = "no hash: the record was modified or cut"
		return c
	}
	c.hash = string(line[m[2]:m[3]])
	c.body = append(append([]byte(nil), line[:m[0]]...), '}')
	var r struct {
		Seq      *uint64           `json:"seq"`
		PrevHash *string           `json:"prev_hash"`
		Sandbox  string            `json:"sandbox_id"`
		Event    string            `json:"event"`
		Counts   map[string]uint64 `json:"counts"`
	}
	if err := json.Unmarshal(c.body, &r); err != nil || r.Seq == nil || r.PrevHash == nil {
		c.badShape = "not an audit record: the record was modified"
		return c
	}
	c.seq, c.prev, c.sandbox, c.event, c.counts = *r.Seq, *r.PrevHash, r.Sandbox, r.Event, r.Counts
	return c
}

// unknownToEmpty undoes orUnknown.
func unknownToEmpty(s string) string {
	if s == "unknown" {
		return ""
	}
	return s
}
