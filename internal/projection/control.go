package projection

import (
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/raysync/raysync/internal/names"
)

// control is what the operator's control ConfigMap (Config.Control) says: whether the wave is paused,
// and which namespaces raysync adopts as a whole. raysync reads it and never writes it, so every
// replica, and raysync after a restart, reads the same decision. A value it cannot read is reported
// and read the safe way: paused, and no namespace adopted.
type control struct {
	paused bool
	reason string    // why, as the ConfigMap says ("" when it says nothing)
	since  time.Time // since when, as the ConfigMap says (zero when it says nothing)
	// adoptAll adopts every cluster in scope; adopt the clusters of these namespaces.
	adoptAll bool
	adopt    map[string]bool
	// problems are the values raysync could not read, each with the reading it applied.
	problems []string
}

// readControl reads the control ConfigMap (nil: none, nothing paused or adopted).
func readControl(cm *corev1.ConfigMap) control {
	var c control
	if cm == nil {
		return c
	}
	switch v := strings.TrimSpace(cm.Data[names.ControlPausedKey]); v {
	case "", "false":
	case "true":
		c.paused = true
	default:
		c.paused = true
		c.problems = append(c.problems, fmt.Sprintf("%s %q is not true or false: read as true (paused)", names.ControlPausedKey, v))
	}
	if c.paused {
		c.reason = strings.TrimSpace(cm.Data[names.ControlReasonKey])
		if v := strings.TrimSpace(cm.Data[names.ControlPausedAtKey]); v != "" {
			if t, err := time.Parse(time.RFC3339, v); err == nil {
				c.since = t
			} else {
				c.problems = append(c.problems, fmt.Sprintf("%s %q is not an RFC 3339 time: ignored", names.ControlPausedAtKey, v))
			}
		}
	}
	for _, ns := range strings.FieldsFunc(cm.Data[names.ControlAdoptKey], func(r rune) bool { return r == ',' || r == ' ' || r == '\n' || r == '\t' }) {
		switch {
		case ns == "all":
			c.adoptAll = true
		case len(validation.IsDNS1123Label(ns)) > 0:
			c.problems = append(c.problems, fmt.Sprintf("%s: %q is not a namespace name: ignored", names.ControlAdoptKey, ns))
		default:
			if c.adopt == nil {
				c.adopt = map[string]bool{}
			}
			c.adopt[ns] = true
		}
	}
	return c
}

// unreadableControl is what raysync reads while it cannot list the control ConfigMap: the wave paused
// (an emergency stop raysync cannot see must not be missed), no namespace adopted, and why.
func unreadableControl(name string) control {
	return control{paused: true, problems: []string{"raysync cannot read the control ConfigMap " + name +
		" (its Role grants get, list and watch on it by name): read as paused until it can"}}
}

// adopts says whether the ConfigMap adopts the clusters of namespace ns.
func (c control) adopts(ns string) bool { return c.adoptAll || c.adopt[ns] }
