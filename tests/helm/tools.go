//go:build tools

// Package tools pins helm's command so `go mod tidy` keeps every module it
// needs in go.sum.
package tools

import _ "helm.sh/helm/v4/cmd/helm"
