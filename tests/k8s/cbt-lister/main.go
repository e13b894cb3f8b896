// The changed-block tracking client of the cluster tests (tests/k8s/cbt.sh):
// a command line around upstream's client library, the package iterator of
// github.com/kubernetes-csi/external-snapshot-metadata, which is what a
// backup tool embeds.  The library does all of the work a client of
// KEP-3314 has to do: it finds the VolumeSnapshots and their contents, the
// CSI driver's SnapshotMetadataService object, mints a ServiceAccount token
// for its audience, dials the csi-snapshot-metadata sidecar with the CA of
// that object and reads the GetMetadataAllocated or GetMetadataDelta stream.
// This file only turns flags into the library's Args.
//
// Why not upstream's own snapshot-metadata-lister: it is a nested module of
// that repository, which the Go module proxy does not serve (404 for every
// version, 2026-11-27); the library it wraps is served (v1.1.0).  The flags
// are the lister's, so the same commands work with either.
//
//	cbt-lister -n NAMESPACE -s SNAPSHOT [-p PREVIOUS | -P PREVIOUS-HANDLE]
//	           [-o table|json] [--service-account SA --service-account-namespace NS]
//	           [--starting-offset N] [--max-results N] [--token-expiry SECONDS]
//	           [--kubeconfig FILE]
//
// Exit status: 0 when the whole stream was read, 1 on any error (printed on
// stderr with the library's or gRPC's words), 2 on bad usage.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"

	"github.com/kubernetes-csi/external-snapshot-metadata/pkg/iterator"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

func main() {
	var args iterator.Args
	var output, kubeconfig string
	var maxResults int
	fs := flag.NewFlagSet(os.Args[0], flag.ContinueOnError)
	both := func(p *string, long, short, usage string) {
		fs.StringVar(p, long, "", usage)
		fs.StringVar(p, short, "", "shorthand for --"+long)
	}
	both(&args.Namespace, "namespace", "n", "namespace of the VolumeSnapshots")
	both(&args.SnapshotName, "snapshot", "s", "the VolumeSnapshot whose blocks are listed")
	both(&args.PrevSnapshotName, "previous-snapshot", "p", "an earlier VolumeSnapshot: list the blocks changed since")
	both(&args.PrevSnapshotID, "previous-snapshot-id", "P", "the CSI handle of an earlier snapshot (wins over -p)")
	both(&output, "output-format", "o", "table or json")
	fs.StringVar(&args.SAName, "service-account", "", "ServiceAccount whose token is presented (default: the pod's)")
	fs.StringVar(&args.SANamespace, "service-account-namespace", "", "its namespace (default: the pod's)")
	fs.Int64Var(&args.TokenExpirySecs, "token-expiry", 600, "lifetime of the minted token, seconds")
	fs.Int64Var(&args.StartingOffset, "starting-offset", 0, "first byte offset asked for")
	fs.IntVar(&maxResults, "max-results", 0, "most extents per message (0: the server's choice)")
	fs.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file (default: the pod's in-cluster configuration)")
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "cbt-lister: unexpected argument %q\n", fs.Arg(0))
		os.Exit(2)
	}
	args.MaxResults = int32(maxResults)
	switch output {
	case "", "table":
		args.Emitter = &iterator.TableEmitter{Writer: os.Stdout}
	case "json":
		args.Emitter = &iterator.JSONEmitter{Writer: os.Stdout}
	default:
		fmt.Fprintf(os.Stderr, "cbt-lister: --output-format %q: want table or json\n", output)
		os.Exit(2)
	}

	var config *rest.Config
	var err error
	if kubeconfig != "" {
		config, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else {
		config, err = rest.InClusterConfig()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "cbt-lister: kubernetes configuration: %v\n", err)
		os.Exit(1)
	}
	if args.Clients, err = iterator.BuildClients(config); err != nil {
		fmt.Fprintf(os.Stderr, "cbt-lister: clients: %v\n", err)
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := iterator.GetSnapshotMetadata(ctx, args); err != nil {
		fmt.Fprintf(os.Stderr, "Error: %v\n", err)
		os.Exit(1)
	}
}
