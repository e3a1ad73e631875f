//go:build tools

// Package tools pins distribution's registry, the real node's private registry (htpasswd, TLS).
package tools

import _ "github.com/distribution/distribution/v3/cmd/registry"
