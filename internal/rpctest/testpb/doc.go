// Package testpb is the test service of idem's gRPC and Connect front
// doors, generated from payments.proto (messages and gRPC stubs here,
// Connect stubs in testpbconnect).
package testpb

//go:generate ../gen.sh
