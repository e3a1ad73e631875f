//go:build tools

// Package tools pins promtool (Prometheus' own rule tester), built by the e2e framework to run
// `promtool test rules` on raysync's alerts.
package tools

import _ "github.com/prometheus/prometheus/cmd/promtool"
