// SPDX-License-Identifier: Apache-2.0

// cbt-client: a SnapshotMetadata client built on the CSI specification's
// own Go bindings and grpc-go (not the project's code), for the tests of
// changed-block tracking (tests/csi/test_csi_snapmeta.py).
//
//	cbt-client -endpoint unix:///path/csi.sock -snapshot ID [-base ID]
//	           [-offset N] [-max N] [-timeout 60s]
//
// Without -base it calls GetMetadataAllocated, with it (even empty)
// GetMetadataDelta,
// reads the whole stream and prints one JSON object on stdout:
//
//	{"ok":true,"type":"VARIABLE_LENGTH","capacity":N,"messages":M,
//	 "max_per_message":K,"blocks":[[offset,size],...]}
//
// or, when the call fails (even after some messages),
//
//	{"ok":false,"code":"NOT_FOUND","message":"...","messages":M,"blocks":[...]}
//
// Exit status: 0 when the call succeeded, 2 when it failed with a gRPC
// status, 1 on a usage or connection error.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

type result struct {
	OK       bool       `json:"ok"`
	Code     string     `json:"code,omitempty"`
	Message  string     `json:"message,omitempty"`
	Type     string     `json:"type,omitempty"`
	Capacity int64      `json:"capacity"`
	Messages int        `json:"messages"`
	MaxPer   int        `json:"max_per_message"`
	Blocks   [][2]int64 `json:"blocks"`
}

type response interface {
	GetBlockMetadataType() csi.BlockMetadataType
	GetVolumeCapacityBytes() int64
	GetBlockMetadata() []*csi.BlockMetadata
}

func main() {
	endpoint := flag.String("endpoint", "", "unix:///path of the plugin's socket")
	snapshot := flag.String("snapshot", "", "snapshot_id (target_snapshot_id with -base)")
	base := flag.String("base", "", "base_snapshot_id: GetMetadataDelta")
	offset := flag.Int64("offset", 0, "starting_offset")
	max := flag.Int("max", 0, "max_results")
	timeout := flag.Duration("timeout", 60*time.Second, "deadline of the call")
	flag.Parse()
	if *endpoint == "" || flag.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "usage: cbt-client -endpoint unix:///path -snapshot ID [-base ID] [-offset N] [-max N]")
		os.Exit(1)
	}
	conn, err := grpc.NewClient(*endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fmt.Fprintln(os.Stderr, "cbt-client:", err)
		os.Exit(1)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	client := csi.NewSnapshotMetadataClient(conn)

	delta := false // -base given, even empty (the refusal of an empty id is tested)
	flag.Visit(func(f *flag.Flag) { delta = delta || f.Name == "base" })
	var recv func() (response, error)
	if !delta {
		s, err := client.GetMetadataAllocated(ctx, &csi.GetMetadataAllocatedRequest{
			SnapshotId: *snapshot, StartingOffset: *offset, MaxResults: int32(*max)})
		if err != nil {
			fail(err, &result{})
		}
		recv = func() (response, error) { return s.Recv() }
	} else {
		s, err := client.GetMetadataDelta(ctx, &csi.GetMetadataDeltaRequest{
			BaseSnapshotId: *base, TargetSnapshotId: *snapshot, StartingOffset: *offset,
			MaxResults: int32(*max)})
		if err != nil {
			fail(err, &result{})
		}
		recv = func() (response, error) { return s.Recv() }
	}
	res := &result{Blocks: [][2]int64{}}
	for {
		m, err := recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			fail(err, res)
		}
		res.Messages++
		res.Type = m.GetBlockMetadataType().String()
		res.Capacity = m.GetVolumeCapacityBytes()
		if n := len(m.GetBlockMetadata()); n > res.MaxPer {
			res.MaxPer = n
		}
		for _, b := range m.GetBlockMetadata() {
			res.Blocks = append(res.Blocks, [2]int64{b.GetByteOffset(), b.GetSizeBytes()})
		}
	}
	res.OK = true
	print(res)
}

func fail(err error, res *result) {
	st, ok := status.FromError(err)
	if !ok {
		fmt.Fprintln(os.Stderr, "cbt-client:", err)
		os.Exit(1)
	}
	res.Code = st.Code().String()
	res.Message = st.Message()
	if res.Blocks == nil {
		res.Blocks = [][2]int64{}
	}
	print(res)
	os.Exit(2)
}

func print(res *result) {
	if err := json.NewEncoder(os.Stdout).Encode(res); err != nil {
		os.Exit(1)
	}
}
