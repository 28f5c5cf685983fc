package forward

import (
	"bytes"
	"encoding/json"
	"strconv"
	"time"

	"agentbox.dev/agentbox/internal/audit"
)

// OTLPLogs turns a batch of trail lines into an OTLP/HTTP JSON
// ExportLogsServiceRequest (opentelemetry-proto's logs service, JSON
// encoding): one resource (agentbox on this node), one scope, one log
// record per line, in the batch's order. Each record's body is its line
// exactly, so what the collector keeps still verifies; its time, severity
// and a few attributes (class, event, sequence, sandbox) are copied out
// for the collector's processors. A line that is not a record is carried
// as it is, with no attributes: the sink forwards, it does not judge.
func OTLPLogs(lines []byte) []byte {
	b := make([]byte, 0, len(lines)*2+512)
	b = append(b, `{"resourceLogs":[{"resource":{"attributes":[`...)
	b = otlpAttr(b, true, "service.name", "agentbox")
	host := audit.Node
	if host == "" {
		host = "unknown"
	}
	b = otlpAttr(b, false, "host.name", host)
	b = append(b, `]},"scopeLogs":[{"scope":{"name":"agentbox.audit","version":"`+audit.SchemaVersion+`"},"logRecords":[`...)
	now := strconv.FormatInt(time.Now().UnixNano(), 10)
	first := true
	for len(lines) > 0 {
		i := bytes.IndexByte(lines, '\n')
		if i < 0 {
			i = len(lines)
		}
		line := lines[:i]
		lines = lines[min(i+1, len(lines)):]
		if len(line) == 0 {
			continue
		}
		if !first {
			b = append(b, ',')
		}
		first = false
		b = otlpRecord(b, line, now)
	}
	return append(b, "]}]}]}"...)
}

func otlpRecord(b, line []byte, now string) []byte {
	var r struct {
		TimeDT     string `json:"time_dt"`
		ClassUID   int    `json:"class_uid"`
		SeverityID int    `json:"severity_id"`
		Severity   string `json:"severity"`
		Metadata   struct {
			Sequence  uint64 `json:"sequence"`
			EventCode string `json:"event_code"`
		} `json:"metadata"`
		Attestations []struct {
			ChainUID string `json:"chain_uid"`
		} `json:"attestation_list"`
	}
	parsed := json.Unmarshal(line, &r) == nil
	b = append(b, `{"observedTimeUnixNano":"`...)
	b = append(b, now...)
	b = append(b, '"')
	if t, err := time.Parse(time.RFC3339Nano, r.TimeDT); parsed && err == nil {
		b = append(b, `,"timeUnixNano":"`...)
		b = strconv.AppendInt(b, t.UnixNano(), 10)
		b = append(b, '"')
	}
	if parsed {
		// OTLP severity numbers: INFO 9, WARN 13, ERROR 17, FATAL 21.
		sev := map[int]int{1: 9, 2: 13, 3: 17, 4: 21, 5: 21, 6: 21}[r.SeverityID]
		if sev != 0 {
			b = append(b, `,"severityNumber":`...)
			b = strconv.AppendInt(b, int64(sev), 10)
			b = append(b, `,"severityText":`...)
			b = audit.AppendJSONString(b, r.Severity)
		}
	}
	b = append(b, `,"body":{"stringValue":`...)
	b = audit.AppendJSONString(b, string(line))
	b = append(b, `}`...)
	if parsed {
		b = append(b, `,"attributes":[`...)
		b = otlpAttr(b, true, "event.name", r.Metadata.EventCode)
		b = append(b, `,{"key":"ocsf.class_uid","value":{"intValue":"`...)
		b = strconv.AppendInt(b, int64(r.ClassUID), 10)
		b = append(b, `"}},{"key":"agentbox.seq","value":{"intValue":"`...)
		b = strconv.AppendUint(b, r.Metadata.Sequence, 10)
		b = append(b, `"}}`...)
		if len(r.Attestations) == 1 {
			b = otlpAttr(b, false, "agentbox.sandbox_id", r.Attestations[0].ChainUID)
		}
		b = append(b, ']')
	}
	return append(b, '}')
}

func otlpAttr(b []byte, first bool, k, v string) []byte {
	if !first {
		b = append(b, ',')
	}
	b = append(b, `{"key":`...)
	b = audit.AppendJSONString(b, k)
	b = append(b, `,"value":{"stringValue":`...)
	b = audit.AppendJSONString(b, v)
	return append(b, `}}`...)
}
