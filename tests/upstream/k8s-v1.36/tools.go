//go:build tools

// Package tools pins the control plane of Kubernetes v1.36.3 for the version
// lanes (tests/upstream/build.sh controlplane-v1.36): kube-apiserver,
// kube-controller-manager and kube-scheduler of that release, each at
// its own release's dependencies (a module per version: one module
// cannot hold two releases of k8s.io/kubernetes). etcd, kwok and kubectl
// come from the main module's build.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver/app"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	_ "k8s.io/kubernetes/cmd/kube-scheduler/app"
)
