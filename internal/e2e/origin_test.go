//go:build e2e

package e2e

import (
	"net/http"

	"golang.org/x/net/websocket"

	"agentbox.dev/agentbox/internal/egressgw/origintest"
)

// originEdge answers what real origins do that an agent could turn
// against the gateway (origintest), and a WebSocket at /ws that echoes
// each message; it says whether it answered r.
func originEdge(w http.ResponseWriter, r *http.Request) bool {
	switch {
	case origintest.Serve(w, r, ""):
	case r.URL.Path == "/ws":
		websocket.Server{Handler: func(ws *websocket.Conn) {
			var msg string
			for websocket.Message.Receive(ws, &msg) == nil {
				websocket.Message.Send(ws, "echo "+msg)
			}
		}}.ServeHTTP(w, r)
	default:
		return false
	}
	return true
}
