module github.com/idem-dev/idem/idemconnect

go 1.26.8

require github.com/idem-dev/idem v0.0.0

require (
	connectrpc.com/connect v1.21.1 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20261110000943-09e21b237f2c // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)

replace github.com/idem-dev/idem => ../
