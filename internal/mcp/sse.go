package mcp

// Server-sent events as they pass: the streamable HTTP transport answers a
// POST with one (the server's messages for that request), and the older
// SSE transport sends every server message on one. Each event is handed
// over whole, as soon as its blank line arrives, and nothing is held back
// longer.

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
)

// EventFunc gets an event's name ("" for the default, message) and its
// data, and returns the data to send instead (the same slice: unchanged),
// or an error that ends the stream.
type EventFunc func(event string, data []byte) ([]byte, error)

// SSE is a text/event-stream, read through fn.
type SSE struct {
	r   *bufio.Reader
	fn  EventFunc
	out bytes.Buffer
	err error
}

// NewSSE reads r's events through fn.
func NewSSE(r io.Reader, fn EventFunc) *SSE {
	return &SSE{r: bufio.NewReaderSize(r, 64<<10), fn: fn}
}

// ErrEventTooLarge is an event whose data is over MaxMessage.
var ErrEventTooLarge = fmt.Errorf("a server-sent event over %d bytes", MaxMessage)

func (s *SSE) Read(p []byte) (int, error) {
	for s.out.Len() == 0 && s.err == nil {
		s.err = s.next()
	}
	if s.out.Len() > 0 {
		return s.out.Read(p)
	}
	return 0, s.err
}

// Event returns the next event as the client gets it, whole (one event
// at a time, for a reader that sends other events between them).
func (s *SSE) Event() ([]byte, error) {
	for s.out.Len() == 0 && s.err == nil {
		s.err = s.next()
	}
	if s.out.Len() > 0 {
		b := bytes.Clone(s.out.Bytes())
		s.out.Reset()
		return b, nil
	}
	return nil, s.err
}

// line reads one line, without its end (\n or \r\n), bounded.
func (s *SSE) line() ([]byte, error) {
	var l []byte
	for {
		chunk, err := s.r.ReadSlice('\n')
		l = append(l, chunk...)
		if len(l) > MaxMessage+16 {
			return nil, ErrEventTooLarge
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		return l, err
	}
}

// next reads one event and writes what the client gets of it.
func (s *SSE) next() error {
	var kept [][]byte // its lines other than data, as they came
	var raw [][]byte  // all its lines, as they came
	var data [][]byte
	event, size := "", 0
	for {
		l, err := s.line()
		if len(l) > 0 {
			raw = append(raw, l)
			text := bytes.TrimSuffix(bytes.TrimSuffix(l, []byte("\n")), []byte("\r"))
			if len(text) == 0 && bytes.HasSuffix(l, []byte("\n")) {
				return s.emit(event, kept, raw, data, true)
			}
			field, value, _ := bytes.Cut(text, []byte(":"))
			value = bytes.TrimPrefix(value, []byte(" "))
			switch string(field) {
			case "data":
				if size += len(value) + 1; size > MaxMessage {
					return ErrEventTooLarge
				}
				data = append(data, value)
				continue
			case "event":
				event = string(value)
			}
			kept = append(kept, l)
		}
		if err != nil {
			if len(raw) > 0 {
				if e := s.emit(event, kept, raw, data, false); e != nil {
					return e
				}
			}
			return err
		}
	}
}

// emit writes an event: as it came when fn left its data as it was, else
// its other lines and the new data.
func (s *SSE) emit(event string, kept, raw, data [][]byte, ended bool) error {
	if len(data) == 0 {
		for _, l := range raw {
			s.out.Write(l)
		}
		return nil
	}
	joined := bytes.Join(data, []byte("\n"))
	got, err := s.fn(event, joined)
	if err != nil {
		return err
	}
	if bytes.Equal(got, joined) {
		for _, l := range raw {
			s.out.Write(l)
		}
		return nil
	}
	for _, l := range kept {
		s.out.Write(l)
	}
	for _, l := range bytes.Split(got, []byte("\n")) {
		s.out.WriteString("data: ")
		s.out.Write(l)
		s.out.WriteByte('\n')
	}
	if ended {
		s.out.WriteByte('\n')
	}
	return nil
}
