#!/usr/bin/env bash
# Generates testpb from payments.proto with Debian's protoc
# (apt-get install protobuf-compiler) and the plugins at the versions below,
# installed from the Go module proxy into a temporary GOBIN. Run through
# `go generate ./internal/rpctest/...`; the generated files are committed, so
# that building and testing need no protoc.
set -euo pipefail
cd "$(dirname "$0")"
command -v protoc >/dev/null || { echo "gen.sh: protoc not found; apt-get install protobuf-compiler" >&2; exit 1; }
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
export GOBIN=$bin GOWORK=off GOFLAGS=-mod=mod
go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2
go install connectrpc.com/connect/cmd/protoc-gen-connect-go@v1.21.1
PATH=$bin:$PATH protoc -I testpb -I /usr/include \
	--go_out=testpb --go_opt=paths=source_relative \
	--go-grpc_out=testpb --go-grpc_opt=paths=source_relative \
	--connect-go_out=testpb --connect-go_opt=paths=source_relative \
	payments.proto
