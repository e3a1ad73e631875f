package projection

import (
	"fmt"
	"sort"
	"strings"
	"unicode"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
)

// MaxTokenBytes bounds the canonical token: Ray sends it in an HTTP header on every request.
const MaxTokenBytes = 4096

// InvalidSourceError says why a source cannot be used. Its message never contains the value.
type InvalidSourceError struct{ Reason string }

func (e *InvalidSourceError) Error() string { return e.Reason }

func invalid(format string, args ...any) error {
	return &InvalidSourceError{Reason: fmt.Sprintf(format, args...)}
}

// ValidateToken returns the canonical token held in key of the source Secret, or why it is unusable.
// secret is nil when the Secret does not exist. A token must be non-empty, at most 4 KiB, valid UTF-8,
// without control characters and without leading or trailing whitespace (a trailing newline from
// `kubectl create secret --from-file` is the classic mistake: Ray compares tokens byte for byte).
func ValidateToken(secret *corev1.Secret, key string) ([]byte, error) {
	if secret == nil {
		return nil, invalid("Secret does not exist")
	}
	if secret.Type != "" && secret.Type != corev1.SecretTypeOpaque {
		return nil, invalid("Secret type is %q, want %q", secret.Type, corev1.SecretTypeOpaque)
	}
	v, ok := secret.Data[key]
	if !ok {
		return nil, invalid("key %q missing (keys present: %s)", key, keyList(secret.Data))
	}
	switch {
	case len(v) == 0:
		return nil, invalid("key %q is empty", key)
	case len(v) > MaxTokenBytes:
		return nil, invalid("key %q holds %d bytes, more than %d", key, len(v), MaxTokenBytes)
	case !utf8.Valid(v):
		return nil, invalid("key %q is not valid UTF-8", key)
	}
	s := string(v)
	if strings.TrimSpace(s) != s {
		return nil, invalid("key %q has leading or trailing whitespace", key)
	}
	for _, r := range s {
		if unicode.IsControl(r) {
			return nil, invalid("key %q contains control characters", key)
		}
	}
	return v, nil
}

func keyList(data map[string][]byte) string {
	if len(data) == 0 {
		return "none"
	}
	keys := make([]string, 0, len(data))
	for k := range data {
		keys = append(keys, fmt.Sprintf("%q", k))
	}
	sort.Strings(keys)
	return strings.Join(keys, ", ")
}
