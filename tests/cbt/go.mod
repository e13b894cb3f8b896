// The changed-block tracking test's client (main.go): the CSI
// specification's own Go bindings (SnapshotMetadata since v1.10; v1.13.0
// is the newest tag the module proxy served on 2026-11-27) and grpc-go.
// Built by build.sh.
module qsd-csi/tests/cbt

go 1.25.0

require (
	github.com/container-storage-interface/spec v1.13.0
	google.golang.org/grpc v1.84.0
)

require (
	golang.org/x/net v0.57.0 // indirect
	golang.org/x/sys v0.47.0 // indirect
	golang.org/x/text v0.40.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260706201446-f0a921348800 // indirect
	google.golang.org/protobuf v1.36.11 // indirect
)
