// Package gateway is raysync's gateway in front of every token-auth cluster's Jobs API and dashboard
// (8265) and Ray Client (10001): clients present any live canonical token, and the gateway forwards
// with the token the target cluster runs on, so a rotation never refuses a client.
//
// The controller publishes everything the gateway needs into one Secret (the Table): which client
// credentials it accepts (digests only), each routed object's cluster and that cluster's token. The
// gateway reads that one Secret and nothing else, so it needs no access to any other Secret, and a
// route and its token always come from the same snapshot: a RayService switching clusters can never
// be paired with the other cluster's token.
package gateway

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// TableKey is the data key of the published Secret.
const TableKey = "table.json"

// Credential names which client token a request presented (metric label credential).
type Credential string

const (
	Current  Credential = "current"  // the canonical token
	Previous Credential = "previous" // the one before it, for the grace period
	Pending  Credential = "pending"  // the next one, before clients are given it
	None     Credential = "none"     // missing or not accepted
)

// Accepted is one client token the gateway accepts: its SHA-256 (never the token), and until when.
type Accepted struct {
	Credential Credential `json:"credential"`
	SHA256     string     `json:"sha256"`
	Until      *time.Time `json:"until,omitempty"` // nil: until the next table
}

// Route is where requests for one RayService or RayCluster go: a cluster's head Service, with the
// token that cluster runs on.
type Route struct {
	Kind    string `json:"kind"`    // RayService or RayCluster
	Cluster string `json:"cluster"` // the RayCluster serving it
	Service string `json:"service"` // that cluster's own head Service (not the RayService's, which may switch first)
	Token   string `json:"token"`   // key into Table.Tokens
	// RayTLS: the cluster's Ray serves gRPC, Ray Client's port too, only over mutual TLS
	// (RAY_USE_TLS): the relay, which speaks HTTP/2 without TLS and holds no client certificate of
	// the cluster's CA, refuses Ray Client for it rather than fail at the cluster.
	RayTLS bool `json:"rayTLS,omitempty"`
}

// Table is the published state. Tokens are keyed by a short digest so clusters on one token share it.
type Table struct {
	Accept []Accepted        `json:"accept"`
	Tokens map[string][]byte `json:"tokens"`
	Routes map[string]Route  `json:"routes"` // by "namespace/name" of the RayService or RayCluster

	digests [][]byte // Accept's SHA-256s, decoded once (prepare) rather than on every request
}

// prepare decodes the accepted digests (before the table answers requests).
func (t *Table) prepare() { t.digests = decodeDigests(t.Accept) }

func decodeDigests(accept []Accepted) [][]byte {
	d := make([][]byte, len(accept))
	for i, a := range accept {
		d[i], _ = hex.DecodeString(a.SHA256)
	}
	return d
}

// Encode is the Secret data for t (deterministic: equal tables encode equally, so the controller
// writes only on change).
func (t *Table) Encode() ([]byte, error) { return json.Marshal(t) }

// Decode parses a published table and checks it is whole.
func Decode(b []byte) (*Table, error) {
	var t Table
	if err := json.Unmarshal(b, &t); err != nil {
		return nil, fmt.Errorf("gateway table: %w", err)
	}
	for _, a := range t.Accept {
		if d, err := hex.DecodeString(a.SHA256); err != nil || len(d) != sha256.Size {
			return nil, errors.New("gateway table: an accepted credential is not a SHA-256")
		}
	}
	for key, r := range t.Routes {
		if len(t.Tokens[r.Token]) == 0 || r.Cluster == "" || r.Service == "" {
			return nil, fmt.Errorf("gateway table: route %s has no cluster, Service or token", key)
		}
	}
	return &t, nil
}

// Digest is how the controller and the gateway name a client token in the table.
func Digest(token []byte) string {
	sum := sha256.Sum256(token)
	return hex.EncodeToString(sum[:])
}

// accepts says which credential token is, comparing in constant time against every live entry (the
// time taken does not depend on which one, if any, matches).
func (t *Table) accepts(token []byte, now time.Time) Credential {
	sum := sha256.Sum256(token)
	got := None
	digests := t.digests
	if len(digests) != len(t.Accept) { // a table not given to SetTable
		digests = decodeDigests(t.Accept)
	}
	for i, a := range t.Accept {
		want := digests[i]
		live := a.Until == nil || now.Before(*a.Until)
		if subtle.ConstantTimeCompare(sum[:], want) == 1 && live && got == None {
			got = a.Credential
		}
	}
	return got
}
