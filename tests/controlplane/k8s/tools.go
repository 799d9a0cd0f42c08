//go:build tools

// Package tools pins the control-plane commands (and the kubelet of real
// test nodes, tests/realnode) so `go mod tidy` keeps every
// module they need in go.sum.
package tools

import (
	_ "k8s.io/kubectl/pkg/cmd"
	_ "k8s.io/kubernetes/cmd/kube-apiserver/app"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	_ "k8s.io/kubernetes/cmd/kube-scheduler/app"
	_ "k8s.io/kubernetes/cmd/kube-proxy/app"
	_ "k8s.io/kubernetes/cmd/kubelet/app"
)
