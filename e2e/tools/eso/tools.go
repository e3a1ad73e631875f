//go:build tools

// Package tools pins External Secrets Operator, the peer `make bench` compares raysync with.
// It is a module of its own so ESO's dependencies and its replace directive never reach raysync's go.mod.
package tools

import (
	_ "github.com/external-secrets/external-secrets/cmd/controller"
)
