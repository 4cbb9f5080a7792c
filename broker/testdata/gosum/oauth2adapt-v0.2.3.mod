module cloud.google.com/go/auth/oauth2adapt

go 1.20

require (
	cloud.google.com/go/auth v0.5.1
	github.com/google/go-cmp v0.6.0
	golang.org/x/oauth2 v0.21.0
)

require (
	cloud.google.com/go/compute/metadata v0.3.0 // indirect
	golang.org/x/net v0.26.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20240624140628-dc46fd24d27d // indirect
	google.golang.org/protobuf v1.34.2 // indirect
)
