//go:build tools

// Package tools pins the commands this module builds; it is never compiled into anything.
package tools

import (
	_ "tailscale.com/cmd/containerboot"
	_ "tailscale.com/cmd/tailscale"
	_ "tailscale.com/cmd/tailscaled"
)
