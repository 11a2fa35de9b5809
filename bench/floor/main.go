// Command floor is a do-nothing scheduler extender that binds: the floor of `make bench-e2e`.
//
// Why it exists: wiring any extender into kube-scheduler costs something before the extender decides anything.
// kube-scheduler encodes every call, sends it over mutual TLS and decodes the reply, and an extender that binds
// makes the Binding itself: one more call from kube-scheduler and one to the API server per pod. This server
// does only that, as cheaply as Go's standard library does it: /filter passes every node it is sent,
// /prioritize scores none (`[]`), and /bind posts a v1 Binding to the API server with the two gpushare
// annotations (ALIYUN_COM_GPU_MEM_IDX and ALIYUN_COM_GPU_MEM_POD) inside it, in one call, as `extender serve`
// writes its allocation. The annotations' values are fixed and mean nothing: the floor counts no GPU memory, so
// kube-scheduler's NodeResourcesFit counts it against the node totals, as when kube-scheduler runs alone. A
// floor run's cost over the alone run is what kube-scheduler and the API server spend on any binding extender on
// this machine; ours costs that and its own work on top.
//
// Like `extender serve`, it accepts only a client certificate signed by -client-ca, offers HTTP/1.1 only and
// sends no TLS 1.3 session tickets (kube-scheduler's client keeps no session cache). With -h2 it also offers
// HTTP/2 in ALPN, which kube-scheduler's client takes: one connection for every call, for experiments. Its own
// client to the API server negotiates HTTP/2, as client-go does.
//
// It logs to stderr, one line "conn N" per new connection (N counting from 1): bench/e2e_run.py counts them for
// the report's "connections opened". Standard library only, so bench/floor/build.sh builds it with no network.
package main

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"time"
)

// extenderArgs is the part of kube-scheduler's ExtenderArgs the floor reads: with nodeCacheCapable, the names.
type extenderArgs struct {
	NodeNames *[]string
}

// filterResult is ExtenderFilterResult: every node passes.
type filterResult struct {
	NodeNames                  []string
	FailedNodes                map[string]string
	FailedAndUnresolvableNodes map[string]string
	Error                      string
}

// bindingArgs is ExtenderBindingArgs.
type bindingArgs struct {
	PodName, PodNamespace, PodUID, Node string
}

// bindingResult is ExtenderBindingResult: an empty Error is a bind done.
type bindingResult struct {
	Error string
}

// binder posts Bindings to the API server as the extender's user.
type binder struct {
	api    string
	token  string
	client *http.Client
}

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "host:port to serve HTTPS on")
	cert := flag.String("tls-cert", "", "serving certificate (PEM)")
	key := flag.String("tls-key", "", "serving certificate's key (PEM)")
	clientCA := flag.String("client-ca", "", "CA that signs the client certificates accepted (PEM)")
	api := flag.String("api", "", "the API server's URL, e.g. https://127.0.0.1:6443")
	apiCA := flag.String("api-ca", "", "CA that signs the API server's certificate (PEM)")
	tokenFile := flag.String("token-file", "", "file holding the bearer token to bind with")
	h2 := flag.Bool("h2", false, "also offer HTTP/2 (ALPN h2); HTTP/1.1 only by default, as `extender serve`")
	flag.Parse()
	log.SetFlags(log.LstdFlags | log.Lmicroseconds)

	token, err := os.ReadFile(*tokenFile)
	if err != nil {
		log.Fatal(err)
	}
	b := &binder{
		api:   strings.TrimSuffix(*api, "/"),
		token: strings.TrimSpace(string(token)),
		client: &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
			TLSClientConfig: &tls.Config{RootCAs: pool(*apiCA)}, ForceAttemptHTTP2: true, MaxIdleConnsPerHost: 100,
		}},
	}
	serving, err := tls.LoadX509KeyPair(*cert, *key)
	if err != nil {
		log.Fatal(err)
	}

	mux := http.NewServeMux()
	mux.HandleFunc("POST /filter", filter)
	mux.HandleFunc("POST /prioritize", prioritize)
	mux.HandleFunc("POST /bind", b.bind)
	var connections atomic.Int64
	server := &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 10 * time.Second,
		TLSConfig: &tls.Config{
			Certificates:           []tls.Certificate{serving},
			ClientCAs:              pool(*clientCA),
			ClientAuth:             tls.RequireAndVerifyClientCert,
			MinVersion:             tls.VersionTLS12,
			SessionTicketsDisabled: true,
		},
		ConnState: func(_ net.Conn, state http.ConnState) {
			if state == http.StateNew {
				log.Printf("conn %d", connections.Add(1))
			}
		},
	}
	protocols := "HTTP/1.1"
	if *h2 {
		protocols = "HTTP/1.1 and HTTP/2"
	} else {
		// A non-nil map keeps net/http from configuring HTTP/2 on the TLS listener.
		server.TLSNextProto = map[string]func(*http.Server, *tls.Conn, http.Handler){}
	}
	listener, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("serving %s on %s", protocols, listener.Addr())
	log.Fatal(server.ServeTLS(listener, "", ""))
}

// pool reads a PEM bundle of CA certificates; the process stops when it cannot.
func pool(file string) *x509.CertPool {
	pem, err := os.ReadFile(file)
	if err != nil {
		log.Fatal(err)
	}
	certs := x509.NewCertPool()
	if !certs.AppendCertsFromPEM(pem) {
		log.Fatalf("%s: no PEM certificate", file)
	}
	return certs
}

// decode reads a JSON request body into v, or answers 400 and returns false.
func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	if err := json.NewDecoder(r.Body).Decode(v); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return false
	}
	return true
}

func reply(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	if err := json.NewEncoder(w).Encode(v); err != nil {
		log.Printf("reply: %v", err)
	}
}

// filter passes every node it is sent.
func filter(w http.ResponseWriter, r *http.Request) {
	var args extenderArgs
	if !decode(w, r, &args) {
		return
	}
	names := []string{}
	if args.NodeNames != nil {
		names = *args.NodeNames
	}
	reply(w, filterResult{
		NodeNames:                  names,
		FailedNodes:                map[string]string{},
		FailedAndUnresolvableNodes: map[string]string{},
	})
}

// prioritize scores no node: kube-scheduler adds nothing to any node's score. The body is read (not decoded), so
// the connection can be kept.
func prioritize(w http.ResponseWriter, r *http.Request) {
	if _, err := io.Copy(io.Discard, r.Body); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write([]byte("[]"))
}

// bind posts the pod's Binding and answers its outcome.
func (b *binder) bind(w http.ResponseWriter, r *http.Request) {
	var args bindingArgs
	if !decode(w, r, &args) {
		return
	}
	result := bindingResult{}
	if err := b.post(r, args); err != nil {
		result.Error = err.Error()
	}
	reply(w, result)
}

func (b *binder) post(r *http.Request, args bindingArgs) error {
	body, err := json.Marshal(map[string]any{
		"apiVersion": "v1",
		"kind":       "Binding",
		"metadata": map[string]any{
			"name":        args.PodName,
			"namespace":   args.PodNamespace,
			"uid":         args.PodUID,
			"annotations": map[string]string{"ALIYUN_COM_GPU_MEM_IDX": "0", "ALIYUN_COM_GPU_MEM_POD": "2"},
		},
		"target": map[string]string{"apiVersion": "v1", "kind": "Node", "name": args.Node},
	})
	if err != nil {
		return err
	}
	path := fmt.Sprintf("%s/api/v1/namespaces/%s/pods/%s/binding",
		b.api, url.PathEscape(args.PodNamespace), url.PathEscape(args.PodName))
	request, err := http.NewRequestWithContext(r.Context(), http.MethodPost, path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	request.Header.Set("Authorization", "Bearer "+b.token)
	request.Header.Set("Content-Type", "application/json")
	request.Header.Set("Accept", "application/json")
	answer, err := b.client.Do(request)
	if err != nil {
		return err
	}
	defer answer.Body.Close()
	status, err := io.ReadAll(answer.Body)
	if err != nil {
		return err
	}
	if answer.StatusCode >= 300 {
		return fmt.Errorf("binding %s/%s to %s: the API answered %s: %s",
			args.PodNamespace, args.PodName, args.Node, answer.Status, bytes.TrimSpace(status))
	}
	return nil
}
