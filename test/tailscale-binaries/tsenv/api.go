package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"
)

// tailscaleAPI is the smallest stand-in for Tailscale's API (api.tailscale.com/api/v2) that Tailscale's Kubernetes
// operator needs to start and to provision a ProxyGroup, served beside the control server on its URL (the operator
// takes both from OPERATOR_LOGIN_SERVER). The operator's own tsnet node waits for Running before any reconciler
// starts, and every replica of a ProxyGroup gets an auth key of its own, so:
//
//   - POST /api/v2/oauth/token: the OAuth client-credentials exchange (any client id and secret), a bearer token;
//   - POST /api/v2/tailnet/-/keys: an auth key (for the operator's node, then one per replica), with that token;
//     testcontrol (no RequireAuthKey) lets any key register;
//   - DELETE /api/v2/device/{id}: a device the operator drops (a replica gone, a key reissued): nothing to do here.
//
// Anything else is answered 501 and counted, as every call is: GET /api-calls on the admin API.
type tailscaleAPI struct {
	next http.Handler // the control server

	mu    sync.Mutex
	keys  int
	calls map[string]int // by "METHOD path", ids replaced by {id}
}

// apiToken is the one bearer token the OAuth exchange hands out.
const apiToken = "tsenv-api-token"

func (a *tailscaleAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !strings.HasPrefix(r.URL.Path, "/api/v2/") {
		a.next.ServeHTTP(w, r)
		return
	}
	path := r.URL.Path
	if id, ok := strings.CutPrefix(path, "/api/v2/device/"); ok && id != "" {
		path = "/api/v2/device/{id}"
	}
	call := r.Method + " " + path
	a.mu.Lock()
	a.calls[call]++
	a.mu.Unlock()
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if call != "POST /api/v2/oauth/token" && r.Header.Get("Authorization") != "Bearer "+apiToken {
		http.Error(w, `{"message":"unauthorized"}`, http.StatusUnauthorized)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	switch call {
	case "POST /api/v2/oauth/token":
		json.NewEncoder(w).Encode(map[string]any{"access_token": apiToken, "token_type": "Bearer", "expires_in": 3600})
	case "POST /api/v2/tailnet/-/keys":
		var req struct {
			Capabilities json.RawMessage `json:"capabilities"`
		}
		if err := json.Unmarshal(body, &req); err != nil {
			http.Error(w, `{"message":"not JSON"}`, http.StatusBadRequest)
			return
		}
		a.mu.Lock()
		a.keys++
		n := a.keys
		a.mu.Unlock()
		now := time.Now().UTC()
		json.NewEncoder(w).Encode(map[string]any{
			"id": fmt.Sprintf("k%d", n), "keyType": "auth", "key": fmt.Sprintf("tskey-auth-tsenv%d", n),
			"created": now, "expires": now.Add(90 * 24 * time.Hour), "capabilities": req.Capabilities,
		})
	case "DELETE /api/v2/device/{id}":
		w.WriteHeader(http.StatusOK)
	default:
		w.WriteHeader(http.StatusNotImplemented)
		fmt.Fprintf(w, `{"message":"tsenv does not serve %s"}`, call)
	}
}

// served lists every call so far, "METHOD path N", sorted.
func (a *tailscaleAPI) served() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := []string{}
	for call, n := range a.calls {
		out = append(out, fmt.Sprintf("%s %d", call, n))
	}
	sort.Strings(out)
	return out
}
