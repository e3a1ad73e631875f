//go:build tools

// Package tools pins helm, used by the tests to lint and render the chart (never raysync's go.mod).
package tools

import _ "helm.sh/helm/v3/cmd/helm"
