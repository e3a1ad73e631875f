package projection

import (
	"crypto/sha256"
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/raysync/raysync/internal/ledger"
	"github.com/raysync/raysync/internal/names"
	"github.com/raysync/raysync/internal/podtemplate"
	"github.com/raysync/raysync/internal/validate"
)

// sourceView is what the configured sources hold at one moment, validated once and shared by every
// decision that moment (one reconcile, or one scrape over every cluster).
type sourceView struct {
	token source
	pull  []source
	// pullNames are the pull sources' names, shared (read only) by every cluster whose copies are all usable.
	pullNames []string
	tls       *source // nil when no client certificate is configured
	// ledger numbers the canonical tokens; rotation is the current token's (zero until the ledger has it).
	ledger   ledger.Ledger
	rotation ledger.Rotation
	// ledgerSecret is the ledger Secret as cached (nil: none yet); ledgerErr says why raysync cannot
	// use it (someone else's Secret under its name, or unreadable), nil when it can.
	ledgerSecret *corev1.Secret
	ledgerErr    error
	// previousRevoked is the rotation whose previous token `syncer revoke-previous` revoked (0: none).
	previousRevoked int
	// pending is the next token (the gateway's pending key), nil when none is configured or valid.
	pending []byte
	// control is what the operator's control ConfigMap says (a pause, the namespaces adopted).
	control control
}

// source is one configured source Secret as cached, and whether it can be used.
type source struct {
	name   types.NamespacedName
	kind   names.Kind
	secret *corev1.Secret // nil when it does not exist
	err    error          // why it cannot be used; nil when valid
	value  []byte         // the token (auth_token kind only)
	digest string         // tokenDigest(value) (auth_token kind only)
	cert   validate.Cert  // what the certificate says (autoscaler_tls kind only)
	// template is how a valid certificate is wired into a cluster's templates (autoscaler_tls kind only).
	template *podtemplate.TLS
}

func (s source) valid() bool { return s.err == nil }

// readSources validates every configured source as get returns it (nil: missing) at time now.
func readSources(cfg Config, get func(types.NamespacedName) *corev1.Secret, now time.Time) *sourceView {
	return readSourcesWith(cfg, get, now, nil)
}

// readSourcesWith is readSources reusing what parsed remembers (nil: parse everything).
func readSourcesWith(cfg Config, get func(types.NamespacedName) *corev1.Secret, now time.Time, parsed *sourceParses) *sourceView {
	v := &sourceView{token: source{name: cfg.Source, kind: names.KindAuthToken, secret: get(cfg.Source)}}
	v.token.value, v.token.err = validate.Token(v.token.secret, cfg.SourceKey)
	if v.token.valid() {
		v.token.digest = tokenDigest(v.token.value)
	}
	if cfg.Ledger.Name != "" {
		v.ledgerSecret = get(cfg.Ledger)
		v.ledger, v.ledgerErr = parsed.ledger(v.ledgerSecret)
		v.rotation, _ = v.ledger.Current(v.token.digest)
		if v.ledgerSecret != nil && v.ledgerErr == nil {
			v.previousRevoked, _ = strconv.Atoi(v.ledgerSecret.Annotations[names.PreviousRevokedAnnotation])
		}
	}
	if k := cfg.Gateway.PendingKey; k != "" && v.token.secret != nil {
		if p, err := validate.Token(v.token.secret, k); err == nil {
			v.pending = p
		}
	}
	for _, n := range cfg.Pods.PullSecrets {
		s := source{name: n, kind: names.KindPullSecret, secret: get(n)}
		s.err = validate.PullSecret(s.secret)
		v.pull = append(v.pull, s)
		v.pullNames = append(v.pullNames, n.Name)
	}
	v.pullNames = slices.Clip(v.pullNames)
	if n := cfg.Pods.AutoscalerTLS; n != nil {
		s := source{name: *n, kind: names.KindAutoscalerTLS, secret: get(*n)}
		s.cert, s.err = parsed.tls(*n, s.secret).At(now)
		s.template = podtemplate.TLS{SecretName: n.Name, MountPath: cfg.Pods.MountPath, HasCA: s.cert.HasCA, APIServer: cfg.Pods.APIServer}.Prepared()
		v.tls = &s
	}
	return v
}

// sourceParses remembers what parsing the ledger and the client certificate gave, by the cached
// object: the caches never change an object (a new version is a new object), so a scrape parses a key
// pair or the ledger's JSON only when it changed, not once per scrape. Its methods work on nil (no memory).
type sourceParses struct {
	mu         sync.Mutex
	tlsOf      map[types.NamespacedName]parsedTLS
	ledgerOf   *corev1.Secret
	ledgerWas  ledger.Ledger
	ledgerErr  error
	ledgerSeen bool
}

type parsedTLS struct {
	secret *corev1.Secret
	parsed validate.ParsedTLS
}

func (m *sourceParses) tls(n types.NamespacedName, s *corev1.Secret) validate.ParsedTLS {
	if m == nil {
		return validate.ParseAutoscalerTLS(s)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if p, ok := m.tlsOf[n]; ok && p.secret == s {
		return p.parsed
	}
	p := validate.ParseAutoscalerTLS(s)
	if m.tlsOf == nil {
		m.tlsOf = map[types.NamespacedName]parsedTLS{}
	}
	m.tlsOf[n] = parsedTLS{secret: s, parsed: p}
	return p
}

// ledger is ledger.Read(s); the Ledger returned is shared, and every change of it makes a copy (Observed).
func (m *sourceParses) ledger(s *corev1.Secret) (ledger.Ledger, error) {
	if m == nil {
		return ledger.Read(s)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.ledgerSeen || m.ledgerOf != s {
		m.ledgerWas, m.ledgerErr = ledger.Read(s)
		m.ledgerOf, m.ledgerSeen = s, true
	}
	return m.ledgerWas, m.ledgerErr
}

// all lists every source in flag order.
func (v *sourceView) all() []source {
	out := append([]source{v.token}, v.pull...)
	if v.tls != nil {
		out = append(out, *v.tls)
	}
	return out
}

// what names a source's content in messages.
func (s source) what(key string) string {
	switch s.kind {
	case names.KindPullSecret:
		return "the registry credentials"
	case names.KindAutoscalerTLS:
		return "the client certificate"
	}
	return "key " + strconv.Quote(key)
}

// content is what a rotation of the source changes: the token, or the Secret's type and data.
func (s source) content() []byte {
	if s.kind == names.KindAuthToken {
		return s.value
	}
	b := []byte(s.secret.Type)
	for _, k := range slices.Sorted(maps.Keys(s.secret.Data)) {
		b = append(b, 0)
		b = append(b, k...)
		b = append(b, 0)
		b = append(b, s.secret.Data[k]...)
	}
	return b
}

// sourceMemory is what raysync remembers about a source between its events (in memory: after a
// restart the first observation is a baseline, not a rotation).
type sourceMemory struct {
	seen   bool
	digest [32]byte // detects rotations; never logged
	reason string   // why the source is invalid ("" when valid)
}

// sourceChange is what one observation of a source means.
type sourceChange struct {
	rotated     bool   // valid content differs from the last valid content seen
	nowInvalid  string // the source became invalid for this (new) reason; "" otherwise
	validAgain  bool   // it was invalid and is valid now
	afterwards  sourceMemory
	description string // what was validated, for messages
}

// sourceTracker remembers every source between its events.
type sourceTracker struct {
	mu   sync.Mutex
	seen map[types.NamespacedName]sourceMemory
}

// observe records one observation of a source and says what it means.
func (t *sourceTracker) observe(s source, key string) sourceChange {
	t.mu.Lock()
	defer t.mu.Unlock()
	ch := observeSource(t.seen[s.name], s, key)
	t.seen[s.name] = ch.afterwards
	return ch
}

// observeSource compares a source with what was remembered about it.
func observeSource(prev sourceMemory, s source, key string) sourceChange {
	ch := sourceChange{afterwards: prev, description: s.what(key)}
	if !s.valid() {
		if reason := s.err.Error(); reason != prev.reason {
			ch.nowInvalid, ch.afterwards.reason = reason, reason
		}
		return ch
	}
	ch.validAgain = prev.reason != ""
	digest := sha256.Sum256(s.content())
	ch.rotated = prev.seen && digest != prev.digest
	ch.afterwards = sourceMemory{seen: true, digest: digest}
	return ch
}
