package broker

// The broker's HTTPS API, for node agents alone. Every request carries the
// node agent's service-account token for the broker's audience, bound to
// its pod; the API server's TokenReview names the node. Every decision is
// logged with the node, and a refusal answers 403 with the reason, which
// the node agent records in its node's trail.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/sirupsen/logrus"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"agentbox.dev/agentbox/internal/checkpoint"
	"agentbox.dev/agentbox/internal/policy"
)

// API is what the server asks of the cluster (Cluster, or a test's).
type API interface {
	Review(ctx context.Context, token, audience string) (Caller, error)
	PodsOn(ctx context.Context, node string) ([]Pod, error)
	Pod(ctx context.Context, ns, name string) (Pod, error)
	Roles(ctx context.Context) (Roles, error)
	SecretValue(ctx context.Context, r policy.SecretRef) ([]byte, error)
	Sandbox(ctx context.Context, ns, name string) (Sandbox, error)
	PatchSandbox(ctx context.Context, sb Sandbox, patch []byte) error
	Hostname(ctx context.Context, node string) string
	Claim(ctx context.Context, ns, name string) (Claim, error)
	// SandboxObject reads a Sandbox whole; CreateSandbox makes one and
	// says its UID (an existing one of that name that is a copy of the
	// same fork counts as made).
	SandboxObject(ctx context.Context, ns, name string) (*unstructured.Unstructured, error)
	CreateSandbox(ctx context.Context, obj *unstructured.Unstructured) (uid string, err error)
}

// Paths of the API.
const (
	PathKeys      = "/v1/keys"
	PathUnwrap    = "/v1/unwrap"
	PathPublicKey = "/v1/public-key"
	PathSandbox   = "/v1/sandbox"
)

// Audience is the token audience the broker accepts by default: a token
// for the API server is not one for the broker, and the reverse.
const Audience = "agentbox-broker"

// Server answers node agents.
type Server struct {
	API API
	// KEK unwraps shared checkpoints' data keys (nil: the broker holds
	// none, and refuses).
	KEK *checkpoint.PrivateKEK
	// Audience the tokens must be for; NodeAgent the only user served
	// (system:serviceaccount:NAMESPACE:NAME).
	Audience, NodeAgent string
	Log                 *logrus.Entry
	// Tickets for suspends (nil: none issued, none accepted).
	Tickets *Tickets
}

// Key is one Secret key's value, as a node gets it.
type Key struct {
	policy.SecretRef
	Value []byte `json:"value"`
}

// KeysResponse is PathKeys' answer: every key the node may hold now.
type KeysResponse struct {
	Node string `json:"node"`
	Keys []Key  `json:"keys"`
	// Errors say why the keys in Unreadable could not be read: the node
	// may hold them, and keeps the values it had.
	Errors     []string           `json:"errors,omitempty"`
	Unreadable []policy.SecretRef `json:"unreadable,omitempty"`
}

// UnwrapRequest asks for a checkpoint's data key, for the pod restoring it.
type UnwrapRequest struct {
	Pod     Ref                    `json:"pod"`
	Wrapped *checkpoint.WrappedKey `json:"wrapped"`
}

// UnwrapResponse carries the data key.
type UnwrapResponse struct {
	DataKey []byte `json:"dataKey"`
}

// SandboxResponse says what the broker wrote (or, for OpSuspending, the
// ticket it issued).
type SandboxResponse struct {
	Message string `json:"message"`
	Pinned  string `json:"pinned,omitempty"`
	Ticket  string `json:"ticket,omitempty"`
	// Copies are the Sandboxes OpForked made.
	Copies []string `json:"copies,omitempty"`
}

// maxBody bounds a request's body.
const maxBody = 64 << 10

// Handler is the server's routes.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+PathKeys, s.serve(s.keys))
	mux.HandleFunc("POST "+PathUnwrap, s.serve(s.unwrap))
	mux.HandleFunc("GET "+PathPublicKey, s.serve(s.publicKey))
	mux.HandleFunc("POST "+PathSandbox, s.serve(s.sandbox))
	mux.HandleFunc("POST "+PathClaim, s.serve(s.claim))
	return mux
}

// errRefused marks a decision against the node (403).
var errRefused = errors.New("refused")

func refuse(format string, a ...any) error {
	return fmt.Errorf("%w: %s", errRefused, fmt.Sprintf(format, a...))
}

// serve authenticates the caller, runs h, and answers its value as JSON
// or its error with a status that says whose fault it is.
func (s *Server) serve(h func(ctx context.Context, c Caller, body []byte) (any, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		log := s.Log.WithField("path", r.URL.Path)
		token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || token == "" {
			log.Warn("refused: no bearer token")
			http.Error(w, "a bearer token (the node agent's, for audience "+s.Audience+") is required", http.StatusUnauthorized)
			return
		}
		c, err := s.API.Review(r.Context(), token, s.Audience)
		if err == nil && c.User != s.NodeAgent {
			err = fmt.Errorf("user %q is not the node agent (%s)", c.User, s.NodeAgent)
		}
		if err == nil && c.Node == "" {
			err = fmt.Errorf("user %q's token is not bound to a pod on a node (no %s)", c.User, NodeNameExtra)
		}
		if err != nil {
			log.WithError(err).Warn("refused: not authenticated")
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		log = log.WithFields(logrus.Fields{"node": c.Node, "pod": c.Pod})
		body, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
		if err != nil || len(body) > maxBody {
			log.Warn("refused: a body over 64 KiB")
			http.Error(w, "a body of at most 64 KiB", http.StatusRequestEntityTooLarge)
			return
		}
		v, err := h(r.Context(), c, body)
		if err != nil {
			code := http.StatusBadGateway
			switch {
			case errors.Is(err, errRefused):
				code = http.StatusForbidden
			case errors.Is(err, errBadRequest):
				code = http.StatusBadRequest
			}
			log.WithError(err).Warn("refused")
			http.Error(w, err.Error(), code)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(v)
	}
}

var errBadRequest = errors.New("bad request")

func decode(body []byte, v any) error {
	if err := strictJSON(body, v); err != nil {
		return fmt.Errorf("%w: %v", errBadRequest, err)
	}
	return nil
}

func (s *Server) keys(ctx context.Context, c Caller, _ []byte) (any, error) {
	pods, err := s.API.PodsOn(ctx, c.Node)
	if err != nil {
		return nil, err
	}
	rs, rerr := s.API.Roles(ctx)
	if rerr != nil && rs.Roles == nil {
		return nil, rerr
	}
	out := KeysResponse{Node: c.Node, Keys: []Key{}}
	if rerr != nil {
		out.Errors = append(out.Errors, rerr.Error())
	}
	for _, g := range KeysFor(c.Node, pods, rs, s.claimedKeys(ctx, c.Node, pods, rs)) {
		v, err := s.API.SecretValue(ctx, g.Ref)
		if err != nil {
			out.Errors = append(out.Errors, err.Error())
			out.Unreadable = append(out.Unreadable, g.Ref)
			continue
		}
		out.Keys = append(out.Keys, Key{SecretRef: g.Ref, Value: v})
		s.Log.WithFields(logrus.Fields{"node": c.Node, "secret": g.Ref.String(), "pods": strings.Join(g.Pods, ",")}).Debug("key given")
	}
	return out, nil
}

func (s *Server) unwrap(ctx context.Context, c Caller, body []byte) (any, error) {
	var req UnwrapRequest
	if err := decode(body, &req); err != nil {
		return nil, err
	}
	if req.Wrapped == nil {
		return nil, fmt.Errorf("%w: no wrapped key", errBadRequest)
	}
	if s.KEK == nil {
		return nil, refuse("this broker holds no checkpoint key")
	}
	p, err := s.API.Pod(ctx, req.Pod.Namespace, req.Pod.Name)
	if err != nil {
		return nil, refuse("pod %s: %v", req.Pod, err)
	}
	if p.UID != req.Pod.UID {
		return nil, refuse("pod %s has uid %s, not %s", req.Pod, p.UID, req.Pod.UID)
	}
	var sb *Sandbox
	if p.ControllerKind == "Sandbox" && p.ControllerGroup == SandboxGroup {
		if got, err := s.API.Sandbox(ctx, p.Namespace, p.ControllerName); err == nil {
			sb = &got
		}
	}
	if err := MayUnwrap(c.Node, req.Wrapped.Checkpoint, p, sb); err != nil {
		return nil, refuse("%v", err)
	}
	dek, err := s.KEK.Unwrap(req.Wrapped)
	if err != nil {
		return nil, refuse("%v", err)
	}
	s.Log.WithFields(logrus.Fields{"node": c.Node, "checkpoint": req.Wrapped.Checkpoint, "pod": p.String()}).Info("data key unwrapped")
	return UnwrapResponse{DataKey: dek}, nil
}

func (s *Server) publicKey(_ context.Context, _ Caller, _ []byte) (any, error) {
	if s.KEK == nil {
		return nil, refuse("this broker holds no checkpoint key")
	}
	return map[string]string{"keyId": s.KEK.ID(), "pem": string(s.KEK.PublicPEM())}, nil
}

func (s *Server) sandbox(ctx context.Context, c Caller, body []byte) (any, error) {
	var w SandboxWrite
	if err := decode(body, &w); err != nil {
		return nil, err
	}
	if w.Op == OpForked {
		return s.fork(ctx, c, w)
	}
	sb, err := s.API.Sandbox(ctx, w.Sandbox.Namespace, w.Sandbox.Name)
	if err != nil {
		return nil, refuse("Sandbox %s: %v", w.Sandbox, err)
	}
	pods, err := s.API.PodsOn(ctx, c.Node)
	if err != nil {
		return nil, err
	}
	host := ""
	if w.Pin && w.Op == OpSuspended {
		host = s.API.Hostname(ctx, c.Node)
	}
	now := time.Now()
	patch, err := SandboxPatch(c.Node, host, w, sb, pods, w.Ticket != "" && s.Tickets.Valid(c.Node, w.Ticket, w, now))
	if err != nil {
		return nil, refuse("%v", err)
	}
	if w.Op == OpSuspending {
		if s.Tickets == nil {
			return nil, refuse("this broker issues no suspend tickets")
		}
		s.Log.WithFields(logrus.Fields{"node": c.Node, "sandbox": sb.String(), "checkpoint": w.Checkpoint}).Info("suspend ticket issued")
		return SandboxResponse{Message: fmt.Sprintf("Sandbox %s: node %s may write %s until %s", sb, c.Node, w.Checkpoint, now.Add(TicketTTL).Format(time.RFC3339)),
			Ticket: s.Tickets.Issue(c.Node, w, now)}, nil
	}
	if err := s.API.PatchSandbox(ctx, sb, patch); err != nil {
		return nil, fmt.Errorf("writing Sandbox %s: %w", sb, err)
	}
	msg := fmt.Sprintf("Sandbox %s: %s %s written for node %s", sb, w.Op, w.Checkpoint, c.Node)
	s.Log.WithFields(logrus.Fields{"node": c.Node, "sandbox": sb.String(), "checkpoint": w.Checkpoint, "op": w.Op}).Info("Sandbox written")
	resp := SandboxResponse{Message: msg}
	if w.Pin && sb.Selector == "" && w.Op == OpSuspended {
		resp.Pinned = host
	}
	return resp, nil
}

// fork makes a fork's copies for the node whose pod of the source runs
// (ForkCopies decides), then answers the source's request.
func (s *Server) fork(ctx context.Context, c Caller, w SandboxWrite) (any, error) {
	src, err := s.API.SandboxObject(ctx, w.Sandbox.Namespace, w.Sandbox.Name)
	if err != nil {
		return nil, refuse("Sandbox %s: %v", w.Sandbox, err)
	}
	pods, err := s.API.PodsOn(ctx, c.Node)
	if err != nil {
		return nil, err
	}
	copies, err := ForkCopies(c.Node, s.API.Hostname(ctx, c.Node), w, src, pods)
	if err != nil {
		return nil, refuse("%v", err)
	}
	var made []Ref
	var names []string
	for _, cp := range copies {
		uid, err := s.API.CreateSandbox(ctx, cp)
		if err != nil {
			return nil, fmt.Errorf("creating %s, a copy of Sandbox %s: %w", cp.GetName(), w.Sandbox, err)
		}
		made = append(made, Ref{Namespace: cp.GetNamespace(), Name: cp.GetName(), UID: uid})
		names = append(names, cp.GetName())
	}
	patch, err := ForkedPatch(w.Checkpoint, made)
	if err != nil {
		return nil, err
	}
	sb := sandboxOf(src)
	if err := s.API.PatchSandbox(ctx, sb, patch); err != nil {
		return nil, fmt.Errorf("answering Sandbox %s's fork: %w", sb, err)
	}
	s.Log.WithFields(logrus.Fields{"node": c.Node, "sandbox": sb.String(), "checkpoint": w.Checkpoint, "copies": names}).Info("Sandbox forked")
	return SandboxResponse{Message: fmt.Sprintf("Sandbox %s forked from %s into %s", sb, w.Checkpoint, strings.Join(names, ", ")), Copies: names}, nil
}
