//go:build tools

// Package tools pins the Kubernetes node commands this module builds.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
