// Package kuberay holds the rules of stock KubeRay that raysync depends on: how it names the auth
// Secret, which labels and keys it uses, and how to read a RayCluster without KubeRay's Go types.
// Everything here is checked against the real operator by the e2e suite.
package kuberay

import (
	"unicode"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

const (
	// ClusterLabel is set on the generated auth Secret and on every Ray pod.
	ClusterLabel = "ray.io/cluster"
	// NodeTypeLabel is head|worker on Ray pods.
	NodeTypeLabel = "ray.io/node-type"
	// OriginatedFromNameLabel and OriginatedFromCRDLabel name the RayService/RayJob that generated a cluster.
	OriginatedFromNameLabel = "ray.io/originated-from-cr-name"
	OriginatedFromCRDLabel  = "ray.io/originated-from-crd"
	// AuthTokenKey is the Secret data key KubeRay reads the token from, in both generated and secretName mode.
	AuthTokenKey = "auth_token"
	// AuthModeToken is spec.authOptions.mode for token authentication.
	AuthModeToken = "token"
)

var (
	RayClusterGVR = schema.GroupVersionResource{Group: "ray.io", Version: "v1", Resource: "rayclusters"}
	RayClusterGVK = schema.GroupVersionKind{Group: "ray.io", Version: "v1", Kind: "RayCluster"}
)

// CheckName is KubeRay's utils.CheckName (v1.4–v1.7): names longer than 50 bytes keep their last 50;
// a leading digit, then a leading punctuation character, is replaced by "r". KubeRay names the
// generated auth Secret CheckName(<cluster name>).
func CheckName(s string) string {
	const maxLength = 50
	if len(s) > maxLength {
		s = s[len(s)-maxLength:]
	}
	if s == "" {
		return s // KubeRay would panic; a RayCluster name is never empty
	}
	// KubeRay converts the first byte, not the first rune, to a rune; so do we.
	if unicode.IsDigit(rune(s[0])) {
		s = "r" + s[1:]
	}
	if unicode.IsPunct(rune(s[0])) {
		s = "r" + s[1:]
	}
	return s
}

// MaxClusterNameLength is KubeRay's limit on RayCluster names (utils.MaxRayClusterNameLength).
const MaxClusterNameLength = 53

// ValidClusterName mirrors KubeRay's ValidateRayClusterMetadata: at most 53 characters and a DNS-1035
// label. KubeRay refuses to reconcile any other RayCluster, so raysync leaves those alone too.
func ValidClusterName(name string) bool {
	// [a-z]([-a-z0-9]*[a-z0-9])?, as validation.IsDNS1035Label, without its regular expression:
	// this runs for every cluster on every scrape.
	if name == "" || len(name) > MaxClusterNameLength || name[0] < 'a' || name[0] > 'z' || name[len(name)-1] == '-' {
		return false
	}
	for i := 1; i < len(name); i++ {
		if c := name[i]; (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' {
			return false
		}
	}
	return true
}

// AuthOptions is what raysync reads from spec.authOptions. Fields of the wrong type are reported in Err.
type AuthOptions struct {
	Mode               string
	SecretName         string // v1.6+: referenced mode when non-empty
	EnableK8sTokenAuth bool
	Err                error
}

// TokenAuth reports whether KubeRay runs this cluster with a Secret-held token (mode token, no K8s token auth).
func (a AuthOptions) TokenAuth() bool {
	return a.Err == nil && a.Mode == AuthModeToken && !a.EnableK8sTokenAuth
}

// ReadAuthOptions reads spec.authOptions without KubeRay's Go types, so no field is ever dropped.
func ReadAuthOptions(rc *unstructured.Unstructured) AuthOptions {
	var a AuthOptions
	raw, found, err := unstructured.NestedFieldNoCopy(rc.Object, "spec", "authOptions")
	if err != nil {
		a.Err = err
		return a
	}
	if !found || raw == nil {
		return a
	}
	if _, ok := raw.(map[string]any); !ok {
		a.Err = typeErr("spec.authOptions", "an object", raw)
		return a
	}
	if a.Mode, _, err = unstructured.NestedString(rc.Object, "spec", "authOptions", "mode"); err != nil {
		a.Err = err
	}
	if a.SecretName, _, err = unstructured.NestedString(rc.Object, "spec", "authOptions", "secretName"); err != nil {
		a.Err = err
	}
	if a.EnableK8sTokenAuth, _, err = unstructured.NestedBool(rc.Object, "spec", "authOptions", "enableK8sTokenAuth"); err != nil {
		a.Err = err
	}
	return a
}

func typeErr(path, want string, got any) error {
	return &FieldTypeError{Path: path, Want: want, Got: got}
}

// FieldTypeError says a RayCluster field has an unexpected type (the API server's schema should prevent it).
type FieldTypeError struct {
	Path, Want string
	Got        any
}

func (e *FieldTypeError) Error() string {
	return e.Path + " is not " + e.Want
}
