//go:build tools

// Package tools pins every program tests/upstream/build.sh builds, so
// `go mod tidy` keeps every module they need in go.sum.
package tools

import (
	_ "github.com/prometheus/prometheus/cmd/prometheus"
	_ "github.com/prometheus/prometheus/cmd/promtool"
	_ "helm.sh/helm/v4/cmd/helm"
	_ "k8s.io/kubectl/pkg/cmd"
	_ "k8s.io/kubernetes/cmd/kube-apiserver/app"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	_ "k8s.io/kubernetes/cmd/kube-proxy/app"
	_ "k8s.io/kubernetes/cmd/kube-scheduler/app"
	_ "k8s.io/kubernetes/cmd/kubelet/app"
	_ "sigs.k8s.io/kwok/pkg/kwok/cmd"
)
