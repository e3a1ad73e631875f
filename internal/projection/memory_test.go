package projection

import (
	"reflect"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/raysync/raysync/internal/names"
)

// TestMemoryChangesNoWrite: another replica, or raysync after a restart, remembers nothing of a cluster.
// Planned with empty memory and with the memory of a process that has planned and applied the same
// input before, every case gets the same writes; memory changes only which Events repeat and what
// the metrics count.
func TestMemoryChangesNoWrite(t *testing.T) {
	tokenOnly := Config{Source: tokenSrc}
	pull := Config{Source: tokenSrc, Pods: PodOptions{PullSecrets: []types.NamespacedName{pullSource}, RecyclePending: true}}
	late := startedPod("c1-head", "c1", rotated.FirstSeen.Add(time.Hour), headPod)
	early := startedPod("c1-head", "c1", rotated.FirstSeen.Add(-time.Hour), headPod)
	marked := func(data string) *corev1.Secret {
		return secret(ns, "c1", map[string]string{"auth_token": data}, ownedBy("c1"), withSecretAnnotation(names.TokenSHA256Annotation, rotated.Digest),
			withSecretAnnotation(names.SyncedAtAnnotation, rotated.FirstSeen.Format(time.RFC3339Nano)))
	}
	kuberays := secret(ns, "c1", map[string]string{"auth_token": oldToken}, ownedBy("c1"))
	tests := map[string]struct {
		cfg  Config
		rc   *unstructured.Unstructured
		opts []func(*ClusterInput)
	}{
		"new cluster, no Secret":                            {cfg: tokenOnly, rc: rayCluster("c1")},
		"KubeRay's random token, no pod":                    {cfg: tokenOnly, rc: rayCluster("c1"), opts: []func(*ClusterInput){target(kuberays)}},
		"in sync, running":                                  {cfg: tokenOnly, rc: rayCluster("c1"), opts: []func(*ClusterInput){target(marked(token)), pods(late)}},
		"changed under containers started after the write":  {cfg: tokenOnly, rc: rayCluster("c1"), opts: []func(*ClusterInput){target(marked(oldToken)), pods(late)}},
		"changed under containers started before the write": {cfg: tokenOnly, rc: rayCluster("c1"), opts: []func(*ClusterInput){target(marked(oldToken)), pods(early)}},
		"deleted under containers on the current token":     {cfg: tokenOnly, rc: rayCluster("c1"), opts: []func(*ClusterInput){pods(late)}},
		"deleted under containers on an older token":        {cfg: tokenOnly, rc: rayCluster("c1"), opts: []func(*ClusterInput){pods(early)}},
		"KubeRay's token under late containers":             {cfg: tokenOnly, rc: rayCluster("c1"), opts: []func(*ClusterInput){target(kuberays), pods(late)}},
		"a foreign Secret of the target's name":             {cfg: tokenOnly, rc: rayCluster("c1"), opts: []func(*ClusterInput){foreign("c1")}},
		"a shared managed copy, running":                    {cfg: tokenOnly, rc: rayCluster("c1", withAuth(map[string]any{"mode": "token", "secretName": "shared"})), opts: []func(*ClusterInput){target(secret(ns, "shared", map[string]string{"auth_token": oldToken}, managed)), pods(early)}},
		"templates without the pull secret":                 {cfg: pull, rc: templatedCluster("c1", resourceVersion("7")), opts: []func(*ClusterInput){copies(pullCopy())}},
		"templates without the pull secret, a pending pod":  {cfg: pull, rc: templatedCluster("c1", resourceVersion("7")), opts: []func(*ClusterInput){copies(pullCopy()), pods(rayPod("p1", "c1", createdAt(planNow.Add(-time.Minute))))}},
		"templates without the pull secret, a running pod":  {cfg: pull, rc: templatedCluster("c1", resourceVersion("7")), opts: []func(*ClusterInput){copies(pullCopy()), pods(startedPod("p1", "c1", planNow.Add(-time.Minute)))}},
		"an unreadable authOptions":                         {cfg: tokenOnly, rc: rayCluster("c1", withAuth("token"))},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			plan := func(mem clusterMemory) ClusterPlan {
				in := input(tc.cfg, tc.rc, []*corev1.Secret{sourceSecret(token), pullSecretSource()}, append(tc.opts, withRotation)...)
				in.Memory = mem
				return planCluster(in, tc.cfg.withDefaults())
			}
			fresh := plan(clusterMemory{})
			// What a process that applied the fresh plan remembers (apply.go), plus every flag set.
			full := clusterMemory{templatesApplied: true, warned: map[string]string{}}
			for _, a := range fresh.Actions {
				if e, ok := a.(RecordEvent); ok && e.DedupKey != "" {
					full.warned[e.DedupKey] = e.DedupValue
				}
			}
			again := plan(full)
			if w, g := writes(fresh.Actions), writes(again.Actions); !reflect.DeepEqual(w, g) {
				t.Errorf("writes depend on process memory:\nempty memory: %#v\nfull memory:  %#v", w, g)
			}
			if fresh.Status.Token != again.Status.Token || !reflect.DeepEqual(fresh.Status.Rotation, again.Status.Rotation) {
				t.Errorf("status depends on process memory: %+v / %+v", fresh.Status, again.Status)
			}
		})
	}
}

// writes is every API write of a plan, without the Events and with the counting-only flag cleared.
func writes(actions []Action) []Action {
	var out []Action
	for _, a := range actions {
		switch a := a.(type) {
		case RecordEvent:
		case PatchCluster:
			a.Reapplied = false
			out = append(out, a)
		default:
			out = append(out, a)
		}
	}
	return out
}
