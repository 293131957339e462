package main

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"regexp"
	"slices"
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
//   - DELETE /api/v2/device/{id}: a device the operator drops (a replica gone, a key reissued): nothing to do here;
//   - GET, PUT and DELETE /api/v2/tailnet/-/vip-services/{name}: the Tailscale Services of an HA Ingress (the
//     operator's internal/client/tailscale VIPServices: Get, CreateOrUpdate, Delete; it never lists them). A
//     Service is stored as put, its VIP (addrs) given at creation as Tailscale's API does (the same as
//     --service-vips hands out); a name that is not svc:<dns-label>, or a put without the addrs of a Service
//     that has some, is refused (400); a Service never put is 404.
//
// Anything else is answered 501 and counted, as every call is: GET /api-calls on the admin API.
type tailscaleAPI struct {
	next http.Handler // the control server
	vips *serviceVIPs // where a Service's VIP comes from

	mu       sync.Mutex
	keys     int
	calls    map[string]int         // by "METHOD path", ids and names replaced by {id} and {name}
	services map[string]*vipService // by name
}

// vipService is a Tailscale Service as Tailscale's API represents it (api.tailscale.com/api/v2 VIPService).
type vipService struct {
	Name        string            `json:"name,omitempty"`
	Addrs       []string          `json:"addrs,omitempty"`
	Comment     string            `json:"comment,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
	Ports       []string          `json:"ports,omitempty"`
	Tags        []string          `json:"tags,omitempty"`
}

// serviceNameRE is a Tailscale Service's name: svc: and a DNS label (tailcfg.ServiceName.Validate).
var serviceNameRE = regexp.MustCompile(`^svc:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$`)

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
	name, isService := strings.CutPrefix(path, "/api/v2/tailnet/-/vip-services/")
	if isService {
		path = "/api/v2/tailnet/-/vip-services/{name}"
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
	case "GET /api/v2/tailnet/-/vip-services/{name}", "PUT /api/v2/tailnet/-/vip-services/{name}", "DELETE /api/v2/tailnet/-/vip-services/{name}":
		a.vipService(w, r.Method, name, body)
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

// vipService answers a call on the Tailscale Service `name`.
func (a *tailscaleAPI) vipService(w http.ResponseWriter, method, name string, body []byte) {
	fail := func(code int, message string) {
		w.WriteHeader(code)
		json.NewEncoder(w).Encode(map[string]string{"message": message})
	}
	if !serviceNameRE.MatchString(name) {
		fail(http.StatusBadRequest, fmt.Sprintf("invalid service name %q", name))
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	stored := a.services[name]
	switch method {
	case http.MethodGet:
		if stored == nil {
			fail(http.StatusNotFound, "not found")
			return
		}
		json.NewEncoder(w).Encode(stored)
	case http.MethodDelete:
		if stored == nil {
			fail(http.StatusNotFound, "not found")
			return
		}
		delete(a.services, name)
		w.WriteHeader(http.StatusOK)
	case http.MethodPut:
		var svc vipService
		if err := json.Unmarshal(body, &svc); err != nil {
			fail(http.StatusBadRequest, "not JSON")
			return
		}
		if svc.Name != "" && svc.Name != name {
			fail(http.StatusBadRequest, fmt.Sprintf("name %q is not the path's %q", svc.Name, name))
			return
		}
		svc.Name = name
		if len(svc.Addrs) == 0 {
			if stored != nil && len(stored.Addrs) > 0 {
				fail(http.StatusBadRequest, "addrs must be given for an existing service")
				return
			}
			svc.Addrs = a.vips.addrs(name)
		}
		a.services[name] = &svc
		json.NewEncoder(w).Encode(svc)
	}
}

// vipServices lists the Tailscale Services as stored, by name.
func (a *tailscaleAPI) vipServices() []vipService {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := []vipService{}
	for _, name := range slices.Sorted(maps.Keys(a.services)) {
		out = append(out, *a.services[name])
	}
	return out
}
