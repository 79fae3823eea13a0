//go:build tools

// Package tools pins kube-router, run on the real node as the NetworkPolicy enforcer only
// (--run-firewall; its router and service proxy stay off: kube-proxy owns Services).
package tools

import (
	_ "github.com/cloudnativelabs/kube-router/v2/cmd/kube-router"
)
