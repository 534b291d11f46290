//go:build tools

// Package tools pins the container runtime of the local real node: containerd, its runc shim
// and ctr (used to import the images built here).
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
