//go:build tools

// Package tools pins etcd for the e2e harness (go.etcd.io/etcd/server/v3 is etcd's main package).
package tools

import _ "go.etcd.io/etcd/server/v3"
