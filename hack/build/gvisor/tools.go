//go:build tools

// Package tools pins the gVisor binaries sandfleet builds: runsc and containerd-shim-runsc-v1,
// both from the one gvisor.dev/gvisor commit named in go.mod.
package tools

import (
	_ "gvisor.dev/gvisor/runsc"
	_ "gvisor.dev/gvisor/shim"
)
