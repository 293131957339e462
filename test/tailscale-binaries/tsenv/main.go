// Command tsenv is the world around a real tailscaled in certshare's tests: Tailscale's own test
// control server (tstest/integration/testcontrol), a local DERP server, and the pebble ACME server
// (used as a library) behind a front that fixes what tailscaled's ACME client needs and counts
// orders. It is meant to run inside a network namespace with only loopback (the harness starts it
// with `nsenter -n`); the admin API is on a unix socket so the test process outside can reach it, and
// so is a second door to the ACME front (for certshare's ACME Renewal Information checks). The admin
// API also sets a certificate's renewalInfo answer (pebble's management endpoint) and revokes a
// certificate with its own key (golang.org/x/crypto/acme, the client tailscaled's own derives from).
//
// Once every listener is up it prints one JSON line on stdout (see ready) and serves until killed.
package main

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"flag"
	"fmt"
	"io"
	"log"
	"maps"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/letsencrypt/pebble/v2/ca"
	"github.com/letsencrypt/pebble/v2/db"
	"github.com/letsencrypt/pebble/v2/va"
	"github.com/letsencrypt/pebble/v2/wfe"
	"golang.org/x/crypto/acme"
	"tailscale.com/derp/derpserver"
	"tailscale.com/net/tsaddr"
	"tailscale.com/tailcfg"
	"tailscale.com/tstest/integration/testcontrol"
	"tailscale.com/types/key"
	"tailscale.com/types/logger"
	"tailscale.com/util/mak"
)

// ready is the line printed once everything listens.
type ready struct {
	Control string `json:"control"` // login server URL for `tailscale up --login-server`
	ACME    string `json:"acme"`    // ACME directory URL for TS_DEBUG_ACME_DIRECTORY_URL
	Bundle  string `json:"bundle"`  // PEM file for SSL_CERT_FILE: the ACME front's TLS CA and pebble's root
	Admin   string `json:"admin"`   // unix socket of the admin API
	// The same ACME front (TLS, the same certificate) on a unix socket: a client outside the network
	// namespace (certshare's ARI checks) reaches it through a TCP relay on its own loopback.
	ACMESocket string `json:"acmeSocket"`
}

// acmeFront counts ACME requests and can answer new orders with a rate-limit problem.
type acmeFront struct {
	next http.Handler

	mu             sync.Mutex
	newOrders      map[string]int // by the order's identifiers, comma-joined
	finalizes      int
	rateLimited    int            // new orders answered 429 so far
	rateLimitLeft  int            // how many further new orders to answer 429
	rateLimitAfter int            // Retry-After seconds of those answers
	renewalInfo    map[string]int // renewalInfo GETs by ARI certificate ID
}

type stats struct {
	NewOrders   map[string]int `json:"newOrders"`
	Orders      int            `json:"orders"` // new orders that reached pebble (rate-limited ones excluded)
	Finalizes   int            `json:"finalizes"`
	RateLimited int            `json:"rateLimited"`
	RenewalInfo map[string]int `json:"renewalInfo"` // renewalInfo GETs by ARI certificate ID, whoever asked
}

// renewalInfoPath is where pebble 2.10 serves ACME Renewal Information (its directory's renewalInfo).
const renewalInfoPath = "/draft-ietf-acme-ari-03/renewalInfo/"

func (f *acmeFront) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, renewalInfoPath):
		f.mu.Lock()
		f.renewalInfo[strings.TrimPrefix(r.URL.Path, renewalInfoPath)]++
		f.mu.Unlock()
	case r.Method == http.MethodPost && r.URL.Path == "/order-plz":
		body, err := readBody(r)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		names := orderNames(body)
		f.mu.Lock()
		limited := f.rateLimitLeft > 0
		if limited {
			f.rateLimitLeft--
			f.rateLimited++
		} else {
			f.newOrders[names]++
		}
		after := f.rateLimitAfter
		f.mu.Unlock()
		if limited {
			// What Let's Encrypt sends (RFC 8555 §6.6): a problem document with Retry-After.
			w.Header().Set("Content-Type", "application/problem+json")
			w.Header().Set("Retry-After", strconv.Itoa(after))
			w.WriteHeader(http.StatusTooManyRequests)
			json.NewEncoder(w).Encode(map[string]any{
				"type":   "urn:ietf:params:acme:error:rateLimited",
				"detail": fmt.Sprintf("too many certificates (5) already issued for this exact set of identifiers in the last 168h0m0s, retry after %ds", after),
				"status": http.StatusTooManyRequests,
			})
			return
		}
	case r.Method == http.MethodPost && strings.HasPrefix(r.URL.Path, "/finalize-order/"):
		f.mu.Lock()
		f.finalizes++
		f.mu.Unlock()
		// pebble 2.10 omits Location on finalize (letsencrypt/pebble#508); tailscaled's ACME client
		// reads the order URL from it, as Let's Encrypt sends it.
		id := strings.TrimPrefix(r.URL.Path, "/finalize-order/")
		w = &locationWriter{ResponseWriter: w, location: "https://" + r.Host + "/my-order/" + id}
	}
	f.next.ServeHTTP(w, r)
}

func (f *acmeFront) stats() stats {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := stats{NewOrders: map[string]int{}, Finalizes: f.finalizes, RateLimited: f.rateLimited, RenewalInfo: map[string]int{}}
	for k, v := range f.newOrders {
		s.NewOrders[k] = v
		s.Orders += v
	}
	for k, v := range f.renewalInfo {
		s.RenewalInfo[k] = v
	}
	return s
}

// readBody reads the body and puts it back for the next handler.
func readBody(r *http.Request) ([]byte, error) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		return nil, err
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	return body, nil
}

// orderNames is the comma-joined identifier values of a new-order JWS (flattened JSON serialisation).
func orderNames(body []byte) string {
	var jws struct{ Payload string }
	if json.Unmarshal(body, &jws) != nil {
		return "?"
	}
	payload, err := base64.RawURLEncoding.DecodeString(jws.Payload)
	if err != nil {
		return "?"
	}
	var order struct{ Identifiers []struct{ Value string } }
	if json.Unmarshal(payload, &order) != nil {
		return "?"
	}
	var names []string
	for _, id := range order.Identifiers {
		names = append(names, id.Value)
	}
	return strings.Join(names, ",")
}

type locationWriter struct {
	http.ResponseWriter
	location string
}

func (l *locationWriter) WriteHeader(code int) {
	if l.Header().Get("Location") == "" {
		l.Header().Set("Location", l.location)
	}
	l.ResponseWriter.WriteHeader(code)
}

func (l *locationWriter) Write(b []byte) (int, error) {
	if l.Header().Get("Location") == "" {
		l.Header().Set("Location", l.location)
	}
	return l.ResponseWriter.Write(b)
}

// selfSignedServer makes a CA and a serving certificate for 127.0.0.1 and ip signed by it.
func selfSignedServer(ip net.IP) (caPEM []byte, cert tls.Certificate, err error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, cert, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "certshare tsenv ACME front CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(30 * 24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, cert, err
	}
	caCert, _ := x509.ParseCertificate(caDER)
	leafKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, cert, err
	}
	leafTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "127.0.0.1"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(30 * 24 * time.Hour),
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), ip},
		DNSNames:     []string{"localhost"},
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leafTmpl, caCert, &leafKey.PublicKey, caKey)
	if err != nil {
		return nil, cert, err
	}
	caPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	return caPEM, tls.Certificate{Certificate: [][]byte{leafDER}, PrivateKey: leafKey}, nil
}

func main() {
	dir := flag.String("dir", "", "directory for the CA bundle and the admin socket (required)")
	magicDNS := flag.String("magicdns-domain", "tailnet-test.ts.net", "MagicDNS suffix: the cert domain is <hostname>.<this>")
	validity := flag.Duration("validity", 90*24*time.Hour, "lifetime of the certificates pebble issues")
	domainsAtStart := flag.Bool("cert-domains", false, "send the cert domain from the start (otherwise: after POST /cert-domains on the admin API)")
	verbose := flag.Bool("v", false, "log control and pebble activity to stderr")
	// The real-cluster tier runs tailscaled in Pods: they reach control, DERP and ACME on the node's
	// address inside the cluster's network namespace.
	listen := flag.String("listen", "127.0.0.1", "IPv4 address every listener binds")
	// Real control lists a Tailscale Service's domain among a node's cert domains only while the node hosts
	// the Service (tailscale cert answers "invalid domain" otherwise).
	serviceHostsOnly := flag.Bool("service-hosts-only", false, "grant <label>.<magicdns-domain> as a cert domain only while a node advertises svc:<label>")
	// Real control gives a Service a VIP, tells its hosts, and routes clients' connections to one of them.
	serviceVIPsOn := flag.Bool("service-vips", false, "route each Tailscale Service's VIP to one of the nodes advertising it, as real control does (see serviceVIPs)")
	// Tailscale's Kubernetes operator talks to Tailscale's API at its login server's URL.
	apiOn := flag.Bool("tailscale-api", false, "serve the part of Tailscale's API that Tailscale's Kubernetes operator needs on the control URL (see tailscaleAPI)")
	flag.Parse()
	if *dir == "" {
		log.Fatal("tsenv: --dir is required")
	}
	listenIP := net.ParseIP(*listen).To4()
	if listenIP == nil {
		log.Fatalf("tsenv: --listen %q is not an IPv4 address", *listen)
	}
	listenAt := net.JoinHostPort(listenIP.String(), "0")
	logf := logger.Discard
	pebbleLog := log.New(discard{}, "", 0)
	if *verbose {
		logf = log.Printf
		pebbleLog = log.New(os.Stderr, "pebble ", log.LstdFlags)
	}

	// DERP on loopback, so that tailscaled does not go looking for Tailscale's own DERP servers.
	derp := derpserver.New(key.NewNode(), logf)
	derpServer := httptest.NewUnstartedServer(derpserver.Handler(derp))
	derpServer.Config.ErrorLog = log.New(discard{}, "", 0)
	derpLn, err := net.Listen("tcp", listenAt)
	if err != nil {
		log.Fatalf("tsenv: DERP listener: %v", err)
	}
	derpServer.Listener.Close()
	derpServer.Listener = derpLn
	derpServer.StartTLS()
	derpPort := derpServer.Listener.Addr().(*net.TCPAddr).Port
	derpMap := &tailcfg.DERPMap{Regions: map[int]*tailcfg.DERPRegion{1: {
		RegionID: 1, RegionCode: "test", RegionName: "loopback",
		Nodes: []*tailcfg.DERPNode{{Name: "1a", RegionID: 1, HostName: listenIP.String(), IPv4: listenIP.String(), IPv6: "none",
			DERPPort: derpPort, STUNPort: -1, InsecureForTests: true}},
	}}}

	controlLn, err := net.Listen("tcp", listenAt)
	if err != nil {
		log.Fatalf("tsenv: control listener: %v", err)
	}
	control := &testcontrol.Server{
		Logf:            logf,
		DERPMap:         derpMap,
		MagicDNSDomain:  *magicDNS,
		ExplicitBaseURL: "http://" + controlLn.Addr().String(),
	}
	// testcontrol sends DNS.CertDomains only once it has a DNS config: AddDNSRecords creates one and
	// pushes a netmap update to every node, which is how the domain "appears".
	dns := &dnsEditor{control: control}
	enableCertDomains := func() {
		dns.edit(func(cfg *tailcfg.DNSConfig) {
			cfg.ExtraRecords = append(cfg.ExtraRecords, tailcfg.DNSRecord{Name: "certshare-tsenv." + *magicDNS, Value: "100.64.0.99"})
		})
	}
	if *domainsAtStart {
		enableCertDomains()
	}
	var onHosts []func(map[string][]*tailcfg.Node)
	if *serviceHostsOnly {
		onHosts = append(onHosts, grantServiceDomains(dns, *magicDNS, log.Printf))
	}
	vips := &serviceVIPs{control: control, dns: dns, magicDNS: *magicDNS, logf: log.Printf,
		vips: map[string][]netip.Addr{}, approved: map[key.NodePublic]tailcfg.ServiceIPMappings{}, state: map[string]*serviceVIP{}}
	if *serviceVIPsOn {
		onHosts = append(onHosts, vips.apply)
	}
	if len(onHosts) > 0 {
		go serviceHosts(control, onHosts...)
	}
	api := &tailscaleAPI{next: control, vips: vips, calls: map[string]int{}, services: map[string]*vipService{}}
	var controlHandler http.Handler = control
	if *apiOn {
		controlHandler = api
	}
	go func() { log.Fatal(http.Serve(controlLn, controlHandler)) }()

	// pebble, as its own command wires it, minus its listeners.
	for k, v := range map[string]string{
		"PEBBLE_VA_ALWAYS_VALID": "1", // no challenge validation: tailscaled publishes DNS-01 through control only
		"PEBBLE_VA_NOSLEEP":      "1",
		"PEBBLE_AUTHZREUSE":      "0", // reused authorizations break tailscaled's renewals
		"PEBBLE_WFE_NONCEREJECT": "0", // deterministic request counts
	} {
		os.Setenv(k, v)
	}
	store := db.NewMemoryStore()
	profiles := map[string]ca.Profile{"default": {Description: "certshare tests", ValidityPeriod: uint64(validity.Seconds())}}
	authority := ca.New(pebbleLog, store, "", "ecdsa", 0, 1, profiles)
	validator := va.New(pebbleLog, 5002, 5001, false, "", store)
	frontend := wfe.New(pebbleLog, store, validator, authority, []string{"pebble.letsencrypt.org"}, false, false, 0, 0)
	front := &acmeFront{next: frontend.Handler(), newOrders: map[string]int{}, renewalInfo: map[string]int{}}

	tlsCA, tlsCert, err := selfSignedServer(listenIP)
	if err != nil {
		log.Fatalf("tsenv: TLS certificate: %v", err)
	}
	acmeTLS := &tls.Config{Certificates: []tls.Certificate{tlsCert}}
	acmeLn, err := tls.Listen("tcp", listenAt, acmeTLS)
	if err != nil {
		log.Fatalf("tsenv: ACME listener: %v", err)
	}
	acmeSocket := filepath.Join(*dir, "acme.sock")
	os.Remove(acmeSocket)
	acmeUnixLn, err := net.Listen("unix", acmeSocket)
	if err != nil {
		log.Fatalf("tsenv: ACME unix listener: %v", err)
	}
	acmeServer := &http.Server{Handler: front, ErrorLog: log.New(discard{}, "", 0)}
	go func() { log.Fatal(acmeServer.Serve(acmeLn)) }()
	go func() { log.Fatal(acmeServer.Serve(tls.NewListener(acmeUnixLn, acmeTLS))) }()
	directoryURL := "https://" + acmeLn.Addr().String() + wfe.DirectoryPath

	bundle := filepath.Join(*dir, "ca-bundle.pem")
	if err := os.WriteFile(bundle, append(tlsCA, authority.GetRootCert(0).PEM()...), 0o644); err != nil {
		log.Fatalf("tsenv: %v", err)
	}

	adminPath := filepath.Join(*dir, "tsenv.sock")
	os.Remove(adminPath)
	adminLn, err := net.Listen("unix", adminPath)
	if err != nil {
		log.Fatalf("tsenv: admin listener: %v", err)
	}
	admin := http.NewServeMux()
	admin.HandleFunc("GET /stats", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(front.stats())
	})
	admin.HandleFunc("POST /cert-domains", func(w http.ResponseWriter, r *http.Request) {
		enableCertDomains()
		w.WriteHeader(http.StatusNoContent)
	})
	// POST /rate-limit?orders=N&retry-after=S: the next N new orders get a 429 rateLimited problem.
	admin.HandleFunc("POST /rate-limit", func(w http.ResponseWriter, r *http.Request) {
		n, err1 := strconv.Atoi(r.URL.Query().Get("orders"))
		after, err2 := strconv.Atoi(r.URL.Query().Get("retry-after"))
		if err1 != nil || err2 != nil || n < 0 || after < 0 {
			http.Error(w, "want orders=N&retry-after=SECONDS", http.StatusBadRequest)
			return
		}
		front.mu.Lock()
		front.rateLimitLeft, front.rateLimitAfter = n, after
		front.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	})
	// POST /set-renewal-info/ {"Certificate": PEM, "ARIResponse": "<any text>"}: pebble's own management
	// endpoint; renewalInfo then answers that text for the certificate (until set again).
	admin.Handle("POST /set-renewal-info/", frontend.ManagementHandler())
	// POST /revoke with a PEM pair (the certificate first in its chain, its private key): revokes the
	// certificate as a holder would, an ACME revokeCert signed with the certificate's own key (JWK form,
	// RFC 8555 section 7.6) through the front. pebble then answers renewalInfo with a window an hour ago.
	frontRoots := x509.NewCertPool()
	frontRoots.AppendCertsFromPEM(tlsCA)
	admin.HandleFunc("POST /revoke", func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		key, certDER, err := parsePair(body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), 30*time.Second)
		defer cancel()
		client := &acme.Client{
			DirectoryURL: directoryURL,
			HTTPClient:   &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: frontRoots}}},
		}
		if err := client.RevokeCert(ctx, key, certDER, acme.CRLReasonUnspecified); err != nil {
			http.Error(w, "revokeCert: "+err.Error(), http.StatusBadGateway)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	// GET /vip-services[?timeout=DURATION]: what control knows of each node's Tailscale Services: the
	// ServicesHash its last Hostinfo carried, and the list it fetches from the node when that hash changes
	// (c2n GET /vip-services, as the real control does). The nodes are asked in parallel; a node that does
	// not answer within the timeout (default 10s) is listed with Online false and no C2N: gone, or not
	// connected to control, so not a place control would send clients.
	admin.HandleFunc("GET /vip-services", func(w http.ResponseWriter, r *http.Request) {
		type nodeServices struct {
			ID                   tailcfg.NodeID
			Hostname             string
			HostinfoServicesHash string
			Online               bool
			C2N                  json.RawMessage
		}
		timeout := 10 * time.Second
		if t := r.URL.Query().Get("timeout"); t != "" {
			d, err := time.ParseDuration(t)
			if err != nil || d <= 0 {
				http.Error(w, "timeout: a positive Go duration", http.StatusBadRequest)
				return
			}
			timeout = d
		}
		nodes := control.AllNodes()
		out := make([]nodeServices, len(nodes))
		var wg sync.WaitGroup
		for i, n := range nodes {
			out[i] = nodeServices{ID: n.ID, Hostname: n.Hostinfo.Hostname(), HostinfoServicesHash: n.Hostinfo.ServicesHash(), C2N: json.RawMessage("null")}
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(r.Context(), timeout)
				defer cancel()
				req, _ := http.NewRequestWithContext(ctx, "GET", "/vip-services", nil)
				res, err := control.NodeRoundTripper(n.Key).RoundTrip(req)
				if err != nil {
					return
				}
				defer res.Body.Close()
				body, err := io.ReadAll(io.LimitReader(res.Body, 1<<20))
				if err == nil && json.Valid(body) {
					out[i].Online = true
					out[i].C2N = body
				}
			}()
		}
		wg.Wait()
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(out)
	})
	// GET /service-vips: each Service's VIP, its hosts and the primary (--service-vips; an empty list otherwise).
	admin.HandleFunc("GET /service-vips", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(vips.list())
	})
	// GET /api-calls: every call to the Tailscale API stand-in so far, "METHOD path N" (--tailscale-api).
	admin.HandleFunc("GET /api-calls", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(api.served())
	})
	// GET /api-vip-services: the Tailscale Services created through the API stand-in, as it stores them (--tailscale-api).
	admin.HandleFunc("GET /api-vip-services", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(api.vipServices())
	})
	go func() { log.Fatal(http.Serve(adminLn, admin)) }()

	line, _ := json.Marshal(ready{
		Control:    control.ExplicitBaseURL,
		ACME:       directoryURL,
		Bundle:     bundle,
		Admin:      adminPath,
		ACMESocket: acmeSocket,
	})
	fmt.Println(string(line))
	select {}
}

// serviceHosts watches which nodes host which Tailscale Services: a node hosts svc:<label> while it lists it as
// active in its answer to control's c2n GET /vip-services, asked again whenever its Hostinfo's ServicesHash changes
// (as the real control does). Every 200 ms; each change of the whole picture goes to each of apply, in order, as
// Service name -> hosting nodes, the oldest (lowest node ID) first.
func serviceHosts(control *testcontrol.Server, apply ...func(map[string][]*tailcfg.Node)) {
	hashes := map[tailcfg.NodeID]string{}
	hosted := map[tailcfg.NodeID][]string{}
	last := "none yet"
	for range time.Tick(200 * time.Millisecond) {
		byID := map[tailcfg.NodeID]*tailcfg.Node{}
		for _, n := range control.AllNodes() {
			byID[n.ID] = n
			hash := n.Hostinfo.ServicesHash()
			if prev, ok := hashes[n.ID]; ok && prev == hash {
				continue
			}
			names, ok := activeVIPServices(control, n.Key)
			if !ok {
				continue // asked again on the next tick
			}
			hashes[n.ID], hosted[n.ID] = hash, names
		}
		hosts := map[string][]*tailcfg.Node{}
		for id, names := range hosted {
			if byID[id] == nil {
				delete(hosted, id)
				delete(hashes, id)
				continue
			}
			for _, name := range names {
				hosts[name] = append(hosts[name], byID[id])
			}
		}
		var picture []string
		for name, nodes := range hosts {
			sort.Slice(nodes, func(i, j int) bool { return nodes[i].ID < nodes[j].ID })
			for _, n := range nodes {
				picture = append(picture, fmt.Sprintf("%s@%d", name, n.ID))
			}
		}
		sort.Strings(picture)
		if now := strings.Join(picture, ","); now != last {
			last = now
			for _, f := range apply {
				f(hosts)
			}
		}
	}
}

// dnsEditor changes control's DNSConfig: tsenv's own changes, one at a time (testcontrol reads it under its own
// lock). Each edit is one pointer store of an edited clone, pushed to every node.
type dnsEditor struct {
	mu      sync.Mutex
	control *testcontrol.Server
}

func (d *dnsEditor) edit(change func(*tailcfg.DNSConfig)) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.control.AddDNSRecords() // a DNS config, without which testcontrol sends no cert domains at all
	cfg := d.control.DNSConfig.Clone()
	change(cfg)
	d.control.DNSConfig = cfg
	d.control.AddDNSRecords() // pushes a map response to every node
}

// grantServiceDomains keeps control's tailnet-wide DNSConfig.CertDomains at `<label>.<magicDNS>` of each Service some
// node hosts. testcontrol has no per-node cert domains, so the grant goes to every node; a test with one node sees
// what real control does. Each change is logged ("service domains granted").
func grantServiceDomains(dns *dnsEditor, magicDNS string, logf logger.Logf) func(map[string][]*tailcfg.Node) {
	var granted []string
	dns.edit(func(*tailcfg.DNSConfig) {}) // a DNS config from the start: each node's own domain is granted
	return func(hosts map[string][]*tailcfg.Node) {
		next := make([]string, 0, len(hosts))
		for name := range hosts {
			next = append(next, strings.TrimPrefix(name, "svc:")+"."+magicDNS)
		}
		sort.Strings(next)
		if strings.Join(next, ",") == strings.Join(granted, ",") {
			return
		}
		granted = next
		logf("tsenv: service domains granted: %v", granted)
		dns.edit(func(cfg *tailcfg.DNSConfig) { cfg.CertDomains = append([]string(nil), granted...) })
	}
}

// serviceVIP is a Service's place in the tailnet as control hands it out (GET /service-vips).
type serviceVIP struct {
	Service string
	Addrs   []netip.Addr // the VIP: IPv4, then IPv6
	Hosts   []string     // hostnames of the nodes hosting it now, the oldest first
	Primary string       // the host whose AllowedIPs carry the VIP: where clients' connections go; "" with no host

	primary key.NodePublic
}

// serviceVIPs does what Tailscale's control does for a Service's clients, as far as their connections need: the
// Service gets a VIP (100.65.0.N and its Tailscale IPv6 twin) when a node first hosts it, and a DNS record
// `<label>.<magicDNS>` -> the IPv4 VIP; each node that ever hosted it (the approved hosts: tsenv approves every
// one) gets its VIPs in its self node's capability NodeAttrServiceHost (a tailcfg.ServiceIPMappings), which makes
// its tailscaled accept packets to them and hand them to its ServeConfig's Services; and one host, the primary,
// carries the VIPs in the AllowedIPs every peer sees (a single Tailscale IP there is routed without --accept-routes).
// The primary stays while it hosts the Service; when it stops, the oldest remaining host takes over (Tailscale's
// failover for overlapping routers), and with none the VIPs are in no one's AllowedIPs. Each change is logged
// ("service VIPs"). The DNS record makes a DNS config, with which testcontrol also sends each node's own cert domain.
type serviceVIPs struct {
	control  *testcontrol.Server
	dns      *dnsEditor
	magicDNS string
	logf     logger.Logf

	mu       sync.Mutex
	vips     map[string][]netip.Addr                      // by Service
	named    map[string]bool                              // Services whose DNS record control has
	approved map[key.NodePublic]tailcfg.ServiceIPMappings // what each node's capability says
	routes   map[key.NodePublic][]netip.Prefix            // the VIPs in each node's AllowedIPs
	state    map[string]*serviceVIP
}

func (s *serviceVIPs) apply(hosts map[string][]*tailcfg.Node) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var records []tailcfg.DNSRecord
	for name, nodes := range hosts {
		if s.vips[name] == nil {
			s.allocate(name)
		}
		if !s.named[name] {
			mak.Set(&s.named, name, true)
			records = append(records, tailcfg.DNSRecord{Name: strings.TrimPrefix(name, "svc:") + "." + s.magicDNS, Value: s.vips[name][0].String()})
		}
		for _, n := range nodes {
			m := s.approved[n.Key]
			if m[tailcfg.ServiceName(name)] != nil {
				continue
			}
			m = maps.Clone(m)
			mak.Set(&m, tailcfg.ServiceName(name), s.vips[name])
			s.approved[n.Key] = m
			raw, _ := json.Marshal(m)
			s.control.SetNodeCapMap(n.Key, tailcfg.NodeCapMap{tailcfg.NodeAttrServiceHost: {tailcfg.RawMessage(raw)}})
		}
	}
	if len(records) > 0 {
		s.dns.edit(func(cfg *tailcfg.DNSConfig) { cfg.ExtraRecords = append(cfg.ExtraRecords, records...) })
	}
	next := map[key.NodePublic][]netip.Prefix{}
	names := slices.Sorted(maps.Keys(s.vips))
	for _, name := range names {
		st := s.state[name]
		if st == nil {
			st = &serviceVIP{Service: name, Addrs: s.vips[name]}
			s.state[name] = st
		}
		st.Hosts = nil
		var primary *tailcfg.Node
		for _, n := range hosts[name] {
			st.Hosts = append(st.Hosts, n.Hostinfo.Hostname())
			if primary == nil || n.Key == st.primary {
				primary = n
			}
		}
		st.Primary, st.primary = "", key.NodePublic{}
		if primary == nil {
			continue
		}
		st.Primary, st.primary = primary.Hostinfo.Hostname(), primary.Key
		for _, a := range s.vips[name] {
			next[primary.Key] = append(next[primary.Key], netip.PrefixFrom(a, a.BitLen()))
		}
	}
	// The new primaries first, then the old ones cleared: a client may see two carriers for a moment, never none.
	for k, r := range next {
		if !slices.Equal(r, s.routes[k]) {
			s.control.SetSubnetRoutes(k, r)
		}
	}
	for k := range s.routes {
		if next[k] == nil {
			s.control.SetSubnetRoutes(k, nil)
		}
	}
	s.routes = next
	var said []string
	for _, name := range names {
		st := s.state[name]
		said = append(said, fmt.Sprintf("%s %v hosts %v primary %q", name, st.Addrs, st.Hosts, st.Primary))
	}
	s.logf("tsenv: service VIPs: %s", strings.Join(said, "; "))
}

// allocate gives the Service its VIP (s.mu held).
func (s *serviceVIPs) allocate(name string) {
	v4 := netip.AddrFrom4([4]byte{100, 65, 0, byte(len(s.vips) + 1)})
	s.vips[name] = []netip.Addr{v4, tsaddr.Tailscale4To6(v4)}
}

// addrs is the Service's VIP, given now if it has none yet: Tailscale's API allocates it when a Service is created
// (tailscaleAPI), before any node hosts it; its DNS record comes with its first host (apply).
func (s *serviceVIPs) addrs(name string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.vips[name] == nil {
		s.allocate(name)
	}
	out := []string{}
	for _, a := range s.vips[name] {
		out = append(out, a.String())
	}
	return out
}

func (s *serviceVIPs) list() []serviceVIP {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []serviceVIP{}
	for _, name := range slices.Sorted(maps.Keys(s.state)) {
		st := *s.state[name]
		st.Hosts = slices.Clone(st.Hosts)
		out = append(out, st)
	}
	return out
}

// activeVIPServices asks a node (c2n GET /vip-services) which Services it serves as active.
func activeVIPServices(control *testcontrol.Server, node key.NodePublic) ([]string, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", "/vip-services", nil)
	res, err := control.NodeRoundTripper(node).RoundTrip(req)
	if err != nil {
		return nil, false
	}
	defer res.Body.Close()
	var answer tailcfg.C2NVIPServicesResponse
	if err := json.NewDecoder(io.LimitReader(res.Body, 1<<20)).Decode(&answer); err != nil {
		return nil, false
	}
	var names []string
	for _, s := range answer.VIPServices {
		if s.Active {
			names = append(names, string(s.Name))
		}
	}
	return names, true
}

// parsePair reads a PEM pair as tailscaled's LocalAPI gives it (type=pair): the private key and the
// first certificate of the chain, in either order.
func parsePair(pemBytes []byte) (crypto.Signer, []byte, error) {
	var key crypto.Signer
	var certDER []byte
	for rest := pemBytes; ; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		switch {
		case block.Type == "CERTIFICATE" && certDER == nil:
			certDER = block.Bytes
		case strings.HasSuffix(block.Type, "PRIVATE KEY") && key == nil:
			parsed, err := parsePrivateKey(block.Bytes)
			if err != nil {
				return nil, nil, err
			}
			key = parsed
		}
	}
	if key == nil || certDER == nil {
		return nil, nil, fmt.Errorf("want a PEM private key and certificate")
	}
	return key, certDER, nil
}

func parsePrivateKey(der []byte) (crypto.Signer, error) {
	if k, err := x509.ParseECPrivateKey(der); err == nil {
		return k, nil
	}
	if k, err := x509.ParsePKCS1PrivateKey(der); err == nil {
		return k, nil
	}
	k, err := x509.ParsePKCS8PrivateKey(der)
	if err != nil {
		return nil, fmt.Errorf("private key: %v", err)
	}
	signer, ok := k.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("private key of type %T cannot sign", k)
	}
	return signer, nil
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
