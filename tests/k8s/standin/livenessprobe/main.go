// A stand-in for the CSI livenessprobe sidecar, built only where the real
// one cannot be had (the Go module proxy refuses github.com/kubernetes-csi/
// livenessprobe: 403, tests/k8s/README.md).  Like the real one it serves
// /healthz on --http-endpoint and answers 200 only when the driver's CSI
// Probe succeeds within --probe-timeout and does not report ready=false.
// It accepts the flags deploy/ passes the real one.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net/http"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

func main() {
	csiAddr := flag.String("csi-address", "/run/csi/socket", "the CSI driver's socket")
	httpEndpoint := flag.String("http-endpoint", ":9808", "address of /healthz")
	timeout := flag.Duration("probe-timeout", time.Second, "bound of one Probe")
	flag.Int("v", 0, "log level (accepted, ignored)")
	flag.Parse()
	log.SetFlags(log.LstdFlags | log.Lmicroseconds)
	log.Printf("stand-in livenessprobe (the real one is not served by the module proxy)")
	conn, err := grpc.NewClient("unix://"+*csiAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatal(err)
	}
	http.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), *timeout)
		defer cancel()
		rsp, err := csi.NewIdentityClient(conn).Probe(ctx, &csi.ProbeRequest{})
		if err != nil {
			log.Printf("health check failed: %v", err)
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if rsp.GetReady() != nil && !rsp.GetReady().GetValue() {
			http.Error(w, "driver responded but is not ready", http.StatusInternalServerError)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	log.Fatal(http.ListenAndServe(*httpEndpoint, nil))
}
