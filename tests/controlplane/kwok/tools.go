//go:build tools

// Package tools pins kwok's controller command so `go mod tidy` keeps every
// module it needs in go.sum.
package tools

import _ "sigs.k8s.io/kwok/pkg/kwok/cmd"
