// A stand-in for csi-node-driver-registrar, built only where the real one
// cannot be had (the Go module proxy refuses github.com/kubernetes-csi/
// node-driver-registrar: 403, tests/k8s/README.md).  It does what the real
// sidecar does for kubelet's plugin watcher and nothing else: asks the CSI
// driver its name (GetPluginInfo), serves kubelet's pluginregistration v1
// Registration service on <registration dir>/<driver>-reg.sock, answering
// GetInfo with type CSIPlugin, the driver's name, the kubelet-side socket
// path and version 1.0.0, exits non-zero when kubelet reports the
// registration failed, and serves /healthz (the socket still there) on
// --http-endpoint.  It accepts the flags deploy/ passes the real one.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	reg "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

type server struct {
	reg.UnimplementedRegistrationServer
	name, endpoint string
}

func (s *server) GetInfo(ctx context.Context, _ *reg.InfoRequest) (*reg.PluginInfo, error) {
	log.Printf("kubelet asked GetInfo: %s at %s", s.name, s.endpoint)
	return &reg.PluginInfo{Type: reg.CSIPlugin, Name: s.name, Endpoint: s.endpoint,
		SupportedVersions: []string{"1.0.0"}}, nil
}

func (s *server) NotifyRegistrationStatus(ctx context.Context, st *reg.RegistrationStatus) (*reg.RegistrationStatusResponse, error) {
	if !st.PluginRegistered {
		log.Printf("registration failed: %s", st.Error)
		os.Exit(1)
	}
	log.Printf("registered with kubelet")
	return &reg.RegistrationStatusResponse{}, nil
}

// driverName asks the driver at addr its name, retrying for at most limit.
func driverName(addr string, limit time.Duration) (string, error) {
	conn, err := grpc.NewClient("unix://"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return "", err
	}
	defer conn.Close()
	end := time.Now().Add(limit)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		info, err := csi.NewIdentityClient(conn).GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
		cancel()
		if err == nil {
			return info.GetName(), nil
		}
		if time.Now().After(end) {
			return "", fmt.Errorf("GetPluginInfo on %s: %w", addr, err)
		}
		time.Sleep(time.Second)
	}
}

func main() {
	csiAddr := flag.String("csi-address", "/run/csi/socket", "the CSI driver's socket in this container")
	kubeletPath := flag.String("kubelet-registration-path", "", "the CSI driver's socket as kubelet sees it")
	regDir := flag.String("plugin-registration-path", "/registration", "kubelet's plugin registration directory")
	httpEndpoint := flag.String("http-endpoint", "", "address of /healthz")
	flag.Int("v", 0, "log level (accepted, ignored)")
	flag.Parse()
	log.SetFlags(log.LstdFlags | log.Lmicroseconds)
	if *kubeletPath == "" {
		log.Fatal("--kubelet-registration-path is required")
	}
	log.Printf("stand-in registrar (the real csi-node-driver-registrar is not served by the module proxy)")
	name, err := driverName(*csiAddr, 5*time.Minute)
	if err != nil {
		log.Fatal(err)
	}
	sock := filepath.Join(*regDir, name+"-reg.sock")
	if err := os.Remove(sock); err != nil && !os.IsNotExist(err) {
		log.Fatalf("removing stale %s: %v", sock, err)
	}
	lis, err := net.Listen("unix", sock)
	if err != nil {
		log.Fatal(err)
	}
	srv := grpc.NewServer()
	reg.RegisterRegistrationServer(srv, &server{name: name, endpoint: *kubeletPath})
	if *httpEndpoint != "" {
		http.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
			if _, err := os.Stat(sock); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			fmt.Fprintln(w, "ok")
		})
		go func() { log.Fatal(http.ListenAndServe(*httpEndpoint, nil)) }()
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-sigs
		srv.Stop()
		os.Remove(sock)
		os.Exit(0)
	}()
	log.Printf("serving registration of %s on %s", name, sock)
	if err := srv.Serve(lis); err != nil {
		log.Fatal(err)
	}
}
