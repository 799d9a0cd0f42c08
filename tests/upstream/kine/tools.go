//go:build tools

// Package tools pins kine, k3s's datastore shim (etcd's API over sqlite),
// for the control plane's kine lane (tests/upstream/build.sh kine). Its own
// module, not the one beside it: kine requires newer etcd and grpc than
// Kubernetes' release pins, and joining them would change what every other
// program is built from.
package tools

import (
	_ "github.com/k3s-io/kine"
)
