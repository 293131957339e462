//go:build tools

// Package tools pins the command this module builds; it is never compiled into anything.
package tools

import _ "tailscale.com/cmd/k8s-operator"
