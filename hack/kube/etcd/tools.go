//go:build tools

// Package tools pins etcd's server for hack/kube.sh, which builds it with
// `go build go.etcd.io/etcd/server/v3` inside this module: etcd's own go.mod
// has replace directives, so `go install ...@version` refuses it.
package tools

import _ "go.etcd.io/etcd/server/v3"
