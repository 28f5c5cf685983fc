package modelapi

// What a model call may cost, known before it goes: the endpoint's
// billing, the request's input bound and output cap. And what it is
// charged once it is done. Pure: the gateway reserves and settles.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
)

// Billing is how the vendor bills an endpoint, as far as the gateway can
// account for it.
type Billing string

const (
	// Generates: the model writes; the response says its usage.
	Generates Billing = "generates"
	// Embeds: input only; the response may say its usage.
	Embeds Billing = "embeds"
	// Free: no tokens (model lists, retrievals, token counts).
	Free Billing = "free"
	// Unaccounted: billed in a way the gateway does not read (batches,
	// files, fine-tuning, audio, images, cached contents, WebSockets):
	// refused under a token budget.
	Unaccounted Billing = "unaccounted"
)

// Endpoint is what a request to a model host calls.
type Endpoint struct {
	// Name is the endpoint's ("messages", "chat.completions",
	// "responses", "embeddings", "generateContent"...), or the request's
	// method and path when it is Unaccounted.
	Name    string
	Billing Billing
}

// EndpointOf classifies a request to a host of api by its method and path
// (without its query). A path with a segment that is empty, "." or "..",
// or with a character outside [A-Za-z0-9._:-] is Unaccounted: the vendor
// could route it elsewhere than it reads.
func EndpointOf(api API, method, path string) Endpoint {
	unaccounted := Endpoint{Name: clip(method+" "+path, 200), Billing: Unaccounted}
	segs := strings.Split(strings.TrimPrefix(path, "/"), "/")
	for _, s := range segs {
		if s == "" || s == "." || s == ".." || strings.IndexFunc(s, func(r rune) bool {
			return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == ':' || r == '-')
		}) >= 0 {
			return unaccounted
		}
	}
	n := len(segs)
	last := segs[n-1]
	prev := func(k int) string {
		if n-1-k < 0 {
			return ""
		}
		return segs[n-1-k]
	}
	get := method == http.MethodGet || method == http.MethodHead
	post := method == http.MethodPost
	// A model list, or one model: every API's.
	if get && (last == "models" || prev(1) == "models" && !strings.Contains(last, ":")) {
		return Endpoint{Name: "models", Billing: Free}
	}
	switch api {
	case Anthropic:
		switch {
		case post && last == "messages" && prev(1) == "v1":
			return Endpoint{Name: "messages", Billing: Generates}
		case post && last == "count_tokens" && prev(1) == "messages":
			return Endpoint{Name: "count_tokens", Billing: Free}
		}
	case OpenAI:
		switch {
		case post && last == "completions" && prev(1) == "chat":
			return Endpoint{Name: "chat.completions", Billing: Generates}
		case post && last == "completions":
			return Endpoint{Name: "completions", Billing: Generates}
		case post && last == "responses":
			return Endpoint{Name: "responses", Billing: Generates}
		case post && last == "embeddings":
			return Endpoint{Name: "embeddings", Billing: Embeds}
		case post && last == "input_tokens" && prev(1) == "responses":
			return Endpoint{Name: "responses.input_tokens", Billing: Free}
		case post && last == "cancel" && prev(2) == "responses":
			return Endpoint{Name: "responses.cancel", Billing: Free}
		case (get || method == http.MethodDelete) && (prev(1) == "responses" || prev(2) == "responses" && last == "input_items"):
			return Endpoint{Name: "responses.retrieve", Billing: Free}
		case get && prev(1) == "completions" && prev(2) == "chat":
			return Endpoint{Name: "chat.completions.retrieve", Billing: Free}
		}
	case Gemini:
		if prev(1) != "models" || !post {
			break
		}
		_, m, _ := strings.Cut(last, ":")
		switch m {
		case "generateContent", "streamGenerateContent":
			return Endpoint{Name: m, Billing: Generates}
		case "embedContent", "batchEmbedContents":
			return Endpoint{Name: m, Billing: Embeds}
		case "countTokens":
			return Endpoint{Name: m, Billing: Free}
		}
	}
	return unaccounted
}

// Reservation is what a call may cost, reserved before it goes.
type Reservation struct {
	// Input bounds its input: the body's size in bytes, as no tokenizer
	// writes more than one token per byte of text.
	Input int64
	// Output is its output cap, times the answers it asks for.
	Output int64
	// CapSet: the request named no cap, and the gateway set one.
	CapSet bool
}

// Tokens is the whole reservation.
func (r Reservation) Tokens() int64 { return r.Input + r.Output }

// Reserve reads the body of a call to e: its input bound and output cap.
// A body that names no cap gets defaultCap set in it, and the new body is
// returned (nil when unchanged). An error says what the gateway cannot
// account for, naming the field.
func Reserve(api API, e Endpoint, body []byte, defaultCap int64) (Reservation, []byte, error) {
	r := Reservation{Input: int64(len(body))}
	if e.Billing != Generates {
		return r, nil, nil
	}
	top, err := object(body)
	if err != nil {
		return r, nil, fmt.Errorf("the request body: %v", err)
	}
	// The field that caps the output, where it lives, and the fields that
	// multiply it.
	var capKeys, multKeys []string
	cfg, cfgKey := top, ""
	switch {
	case api == Anthropic:
		capKeys = []string{"max_tokens"}
	case e.Name == "responses":
		capKeys = []string{"max_output_tokens"}
		if b, err := boolField(top, "background"); err != nil || b {
			return r, nil, refusal(err, "background: a background response is written after its answer, and its usage cannot be read")
		}
	case e.Name == "chat.completions":
		capKeys, multKeys = []string{"max_completion_tokens", "max_tokens"}, []string{"n"}
	case e.Name == "completions":
		capKeys, multKeys = []string{"max_tokens"}, []string{"n", "best_of"}
	case api == Gemini:
		// Protocol buffers' JSON takes either spelling.
		capKeys, multKeys = []string{"maxOutputTokens", "max_output_tokens"}, []string{"candidateCount", "candidate_count"}
		if cfgKey, err = oneOf(top, "generationConfig", "generation_config"); err != nil {
			return r, nil, err
		}
		if cfgKey == "" {
			cfg, cfgKey = map[string]json.RawMessage{}, "generationConfig"
		} else if cfg, err = object(top[cfgKey]); err != nil {
			return r, nil, fmt.Errorf("%s: %v", cfgKey, err)
		}
	}
	mult := int64(1)
	for _, k := range multKeys {
		if v, ok, err := count(cfg, k); err != nil {
			return r, nil, err
		} else if ok {
			mult = max(mult, v)
		}
	}
	var capKey string
	for _, k := range capKeys {
		if _, ok := cfg[k]; ok && string(cfg[k]) != "null" {
			if capKey != "" {
				return r, nil, fmt.Errorf("%s and %s: the request names two output caps", capKey, k)
			}
			capKey = k
		}
	}
	var out []byte
	limit := defaultCap
	if capKey != "" {
		v, _, err := count(cfg, capKey)
		if err != nil {
			return r, nil, err
		}
		limit = v
	} else {
		if e.Name == "completions" {
			limit = 16 // the API's own default
		} else {
			r.CapSet = true
			cfg[capKeys[0]] = json.RawMessage(strconv.FormatInt(defaultCap, 10))
			if cfgKey != "" {
				raw, _ := json.Marshal(cfg)
				top[cfgKey] = raw
			}
			out, _ = json.Marshal(top)
		}
	}
	if limit > math.MaxInt64/mult-r.Input {
		return r, nil, fmt.Errorf("%s: %d answers of %d tokens overflow", capKeys[0], mult, limit)
	}
	r.Output = limit * mult
	return r, out, nil
}

func refusal(err error, why string) error {
	if err != nil {
		return err
	}
	return fmt.Errorf("%s", why)
}

// object parses a JSON object's members, refusing one that names a member
// twice (parsers differ on which one wins).
func object(raw []byte) (map[string]json.RawMessage, error) {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	if t, err := d.Token(); err != nil || t != json.Delim('{') {
		return nil, fmt.Errorf("not a JSON object")
	}
	out := map[string]json.RawMessage{}
	for d.More() {
		t, err := d.Token()
		if err != nil {
			return nil, fmt.Errorf("not JSON: %v", err)
		}
		k, _ := t.(string)
		var v json.RawMessage
		if err := d.Decode(&v); err != nil {
			return nil, fmt.Errorf("not JSON: %v", err)
		}
		if _, dup := out[k]; dup {
			return nil, fmt.Errorf("%s: named twice", clip(k, 100))
		}
		out[k] = v
	}
	if _, err := d.Token(); err != nil {
		return nil, fmt.Errorf("not JSON: %v", err)
	}
	if _, err := d.Token(); err == nil {
		return nil, fmt.Errorf("not one JSON value")
	}
	return out, nil
}

// oneOf is the key of m among keys ("" none), refusing two.
func oneOf(m map[string]json.RawMessage, keys ...string) (string, error) {
	found := ""
	for _, k := range keys {
		if _, ok := m[k]; ok {
			if found != "" {
				return "", fmt.Errorf("%s and %s: the request names both", found, k)
			}
			found = k
		}
	}
	return found, nil
}

// count is a whole number field (a JSON number, or a string of one, as
// lax parsers take it), at least 1; ok is false when it is absent or null.
func count(m map[string]json.RawMessage, k string) (int64, bool, error) {
	raw, ok := m[k]
	if !ok || string(raw) == "null" {
		return 0, false, nil
	}
	var s string
	if json.Unmarshal(raw, &s) != nil {
		s = string(raw)
	}
	f, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil || f < 1 || f != math.Trunc(f) || f > 1<<40 {
		return 0, false, fmt.Errorf("%s: %s is not a whole number of at least 1", k, clip(string(raw), 40))
	}
	return int64(f), true, nil
}

// boolField is a boolean field (false when absent or null).
func boolField(m map[string]json.RawMessage, k string) (bool, error) {
	raw, ok := m[k]
	if !ok || string(raw) == "null" {
		return false, nil
	}
	var b bool
	if json.Unmarshal(raw, &b) != nil {
		return false, fmt.Errorf("%s: %s is not a boolean", k, clip(string(raw), 40))
	}
	return b, nil
}

// Charge is what a call is charged once done: its response's final usage
// when it was read; else, as the vendor bills what it generated however
// much of it was read, its reservation (or the usage read, if more). An
// error status is not billed.
func Charge(b Billing, r Reservation, status int, res Response) int64 {
	switch {
	case b == Free:
		return 0
	case status >= 400:
		return 0
	case res.Usage.Final, b == Embeds && res.Usage.Known:
		return res.Usage.Total
	}
	return max(r.Tokens(), res.Usage.Total)
}
