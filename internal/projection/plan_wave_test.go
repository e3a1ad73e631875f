package projection

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	clienttesting "k8s.io/client-go/testing"

	"github.com/raysync/raysync/internal/ledger"
	"github.com/raysync/raysync/internal/names"
)

// view plans one cluster for the wave: rc running since `since` on the old token (or on the current
// one with holds), with the given input options.
func view(t *testing.T, cfg Config, rc *unstructured.Unstructured, holds bool, opts ...func(*ClusterInput)) clusterView {
	t.Helper()
	value := oldToken
	if holds {
		value = token
	}
	// raysync wrote the token the cluster runs on (it was born while raysync ran: adopted).
	tgt := secret(ns, rc.GetName(), map[string]string{"auth_token": value}, ownedBy(rc.GetName()), marked(value, planNow.Add(-6*time.Hour)))
	tgt.OwnerReferences[0].UID = rc.GetUID()
	all := append([]func(*ClusterInput){target(tgt), pods(startedPod(rc.GetName()+"-head", rc.GetName(), planNow.Add(-5*time.Hour), headPod)), withRotation}, opts...)
	in := input(cfg, rc, []*corev1.Secret{sourceSecret(token)}, all...)
	return clusterView{in: in, plan: planCluster(in, cfg)}
}

// notReady: the cluster's pods were re-created an hour ago, its head not Ready (a restart that does not come up).
func notReady(cluster string) func(*ClusterInput) {
	return pods(startedPod(cluster+"-head", cluster, planNow.Add(-time.Hour)))
}

func restartCluster(name string, opts ...func(*unstructured.Unstructured)) *unstructured.Unstructured {
	return rayCluster(name, append([]func(*unstructured.Unstructured){annotated(names.RotationAnnotation, "restart"), resourceVersion("3")}, opts...)...)
}

func kinds(acts []Action) []string {
	var out []string
	for _, a := range acts {
		switch a := a.(type) {
		case PatchRotation:
			what := "patch"
			if a.Starts != "" {
				what = "start"
			} else if a.Completes > 0 {
				what = "complete"
			}
			if a.Abandons != "" {
				what = "abandon"
			}
			out = append(out, what+" "+string(a.Kind)+" "+a.Name)
		case RecordEvent:
			m, _ := a.Object.(metav1.Object)
			out = append(out, "event "+a.Reason+" "+m.GetName())
		}
	}
	return out
}

func TestPlanWave(t *testing.T) {
	cfg := Config{Source: tokenSrc, Rotation: RotationOptions{MaxConcurrent: 2, Timeout: time.Hour}}.withDefaults()
	started := func(ago time.Duration) func(*unstructured.Unstructured) {
		return annotated(names.RotationStartedAnnotation, planNow.Add(-ago).Format(time.RFC3339))
	}
	svc := rayService("svc")
	tests := map[string]struct {
		views    func() []clusterView
		expected map[string]bool
		want     []string
		inFlight int
		blocked  bool
		requeue  time.Duration // checked when set
	}{
		"three behind, two at a time: the first two by name": {
			views: func() []clusterView {
				return []clusterView{view(t, cfg, restartCluster("c3"), false), view(t, cfg, restartCluster("c1"), false), view(t, cfg, restartCluster("c2"), false)}
			},
			want:     []string{"start RayCluster c1", "event RotationStarted c1", "start RayCluster c2", "event RotationStarted c2"},
			inFlight: 2,
		},
		"one in flight: one more": {
			views: func() []clusterView {
				return []clusterView{view(t, cfg, restartCluster("c1", started(time.Minute), setPath(true, "spec", "suspend")), false),
					view(t, cfg, restartCluster("c2"), false), view(t, cfg, restartCluster("c3"), false)}
			},
			want: []string{"start RayCluster c2", "event RotationStarted c2"}, inFlight: 2,
		},
		"started by this process, not yet in the caches: counts": {
			views: func() []clusterView {
				return []clusterView{view(t, cfg, restartCluster("c2"), false), view(t, cfg, restartCluster("c3"), false)}
			},
			expected: map[string]bool{"RayCluster/ray/c1": true},
			want:     []string{"start RayCluster c2", "event RotationStarted c2"}, inFlight: 2,
		},
		"held clusters and current ones do not move": {
			views: func() []clusterView {
				return []clusterView{view(t, cfg, rayCluster("held"), false), view(t, cfg, restartCluster("current"), true)}
			},
		},
		"`syncer rotate` moves a held cluster": {
			views: func() []clusterView {
				return []clusterView{view(t, cfg, rayCluster("held", annotated(names.RotateAnnotation, "now")), false)}
			},
			want: []string{"start RayCluster held", "event RotationStarted held"}, inFlight: 1,
		},
		"raysync.dev/rotate=false requests nothing: the held cluster stays, the annotation stays": {
			views: func() []clusterView {
				return []clusterView{view(t, cfg, rayCluster("held", annotated(names.RotateAnnotation, "false")), false)}
			},
		},
		// Every pod gone and the new token written: resumed only once every kubelet's Secret cache can
		// have the write (1.5 s after it), or a lagging one could start the new pods on the old token.
		"restart: the new token written 0.5 s ago: still suspended, looked at again when the write is visible": {
			views: func() []clusterView {
				return []clusterView{view(t, cfg, restartCluster("c1", started(time.Minute), setPath(true, "spec", "suspend")), true,
					pods(), writtenAgo(500*time.Millisecond))}
			},
			inFlight: 1, requeue: time.Second,
		},
		"restart: the new token written 2 s ago: resumed": {
			views: func() []clusterView {
				return []clusterView{view(t, cfg, restartCluster("c1", started(time.Minute), setPath(true, "spec", "suspend")), true,
					pods(), writtenAgo(2*time.Second))}
			},
			want: []string{"patch RayCluster c1"}, inFlight: 1,
		},
		"past the timeout, its new pods never ready: blocked once, and nothing else starts": {
			views: func() []clusterView {
				return []clusterView{view(t, cfg, restartCluster("c1", started(2*time.Hour), annotated(names.RotationTargetAnnotation, "7")), true, notReady("c1")),
					view(t, cfg, restartCluster("c2"), false)}
			},
			want: []string{"patch RayCluster c1", "event RotationBlocked c1"}, inFlight: 1, blocked: true,
		},
		"blocked and already reported: quiet, still blocking": {
			views: func() []clusterView {
				return []clusterView{view(t, cfg, restartCluster("c1", started(2*time.Hour), annotated(names.RotationTargetAnnotation, "7"),
					annotated(names.RotationBlockedAnnotation, "x")), true, notReady("c1")), view(t, cfg, restartCluster("c2"), false)}
			},
			inFlight: 1, blocked: true,
		},
		"blocked on an older rotation: the new wave goes on": {
			views: func() []clusterView {
				return []clusterView{view(t, cfg, restartCluster("c1", started(2*time.Hour), annotated(names.RotationTargetAnnotation, "6"),
					annotated(names.RotationBlockedAnnotation, "x")), true, notReady("c1")), view(t, cfg, restartCluster("c2"), false)}
			},
			want: []string{"start RayCluster c2", "event RotationStarted c2"}, inFlight: 2,
		},
		"restart: every pod gone and the Secret on the new token: start again": {
			views: func() []clusterView {
				return []clusterView{view(t, cfg, restartCluster("c1", started(time.Minute), setPath(true, "spec", "suspend")), true, pods())}
			},
			want: []string{"patch RayCluster c1"}, inFlight: 1,
		},
		"restart: ready again on the new token: complete": {
			views: func() []clusterView {
				return []clusterView{view(t, cfg, restartCluster("c1", started(time.Minute)), true,
					pods(startedPod("c1-head", "c1", planNow.Add(-30*time.Second), headPod)))}
			},
			want: []string{"complete RayCluster c1", "event RotationCompleted c1"},
		},
		"a RayService's cluster: replaced": {
			views: func() []clusterView {
				return []clusterView{view(t, cfg, rayCluster("svc-a", ofRayService("svc")), false, owner(svc))}
			},
			want: []string{"start RayService svc", "event RotationStarted svc", "event RotationStarted svc-a"}, inFlight: 1,
		},
		"a RayService already starting a new cluster of its own: wait": {
			views: func() []clusterView {
				return []clusterView{view(t, cfg, rayCluster("svc-a", ofRayService("svc")), false,
					owner(rayService("svc", setPath("svc-x", "status", "pendingServiceStatus", "rayClusterName"))))}
			},
		},
		"replacement: serving from the new cluster, the old one gone: complete": {
			views: func() []clusterView {
				rs := rayService("svc", started(3*time.Minute), annotated(names.RotationTargetAnnotation, "7"),
					setPath("svc-b", "status", "activeServiceStatus", "rayClusterName"))
				b := rayCluster("svc-b", ofRayService("svc"), func(u *unstructured.Unstructured) {
					u.SetCreationTimestamp(metav1.NewTime(planNow.Add(-2 * time.Minute)))
				})
				return []clusterView{view(t, cfg, b, true, owner(rs))}
			},
			want: []string{"complete RayService svc", "event RotationCompleted svc", "event RotationCompleted svc-b"},
		},
		"replacement: serving from a new cluster that started on another token: over, not completed": {
			views: func() []clusterView {
				rs := rayService("svc", started(3*time.Minute), annotated(names.RotationTargetAnnotation, "7"),
					setPath("svc-b", "status", "activeServiceStatus", "rayClusterName"))
				b := rayCluster("svc-b", ofRayService("svc"), func(u *unstructured.Unstructured) {
					u.SetCreationTimestamp(metav1.NewTime(planNow.Add(-2 * time.Minute)))
				})
				return []clusterView{view(t, cfg, b, false, owner(rs))}
			},
			want: []string{"patch RayService svc", "event RotationRetried svc", "event RotationRetried svc-b"},
		},
		"replacement `syncer rotate` asked for, of a held RayService's cluster: complete": {
			views: func() []clusterView {
				rs := rayService("svc", started(3*time.Minute), annotated(names.RotationTargetAnnotation, "7"),
					setPath("svc-b", "status", "activeServiceStatus", "rayClusterName"))
				b := rayCluster("svc-b", ofRayService("svc"), annotated(names.RotationAnnotation, names.PolicyHold), func(u *unstructured.Unstructured) {
					u.SetCreationTimestamp(metav1.NewTime(planNow.Add(-2 * time.Minute)))
				})
				return []clusterView{view(t, cfg, b, true, owner(rs))}
			},
			want: []string{"complete RayService svc", "event RotationCompleted svc", "event RotationCompleted svc-b"},
		},
		"replacement: the old cluster still there: not yet": {
			views: func() []clusterView {
				rs := rayService("svc", started(3*time.Minute), setPath("svc-b", "status", "activeServiceStatus", "rayClusterName"))
				b := rayCluster("svc-b", ofRayService("svc"), func(u *unstructured.Unstructured) {
					u.SetCreationTimestamp(metav1.NewTime(planNow.Add(-2 * time.Minute)))
				})
				return []clusterView{view(t, cfg, rayCluster("svc-a", ofRayService("svc")), false, owner(rs)), view(t, cfg, b, true, owner(rs))}
			},
			inFlight: 1,
		},
		"a RayJob's cluster while its job runs: never": {
			views: func() []clusterView {
				job := rayService("job", setPath("Running", "status", "jobDeploymentStatus"))
				return []clusterView{view(t, cfg, rayCluster("job-a", annotated(names.RotateAnnotation, "now"),
					func(u *unstructured.Unstructured) {
						u.SetLabels(map[string]string{"ray.io/originated-from-crd": "RayJob", "ray.io/originated-from-cr-name": "job"})
					}), false, owner(job))}
			},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			w := planWave(tc.views(), cfg, planNow, tc.expected)
			if diff := cmp.Diff(tc.want, kinds(w.Actions)); diff != "" {
				t.Errorf("actions (-want +got):\n%s", diff)
			}
			if w.InFlight != tc.inFlight || w.Blocked != tc.blocked {
				t.Errorf("in flight %d, blocked %v; want %d, %v", w.InFlight, w.Blocked, tc.inFlight, tc.blocked)
			}
			if tc.requeue != 0 && w.RequeueAfter != tc.requeue {
				t.Errorf("requeue after %s, want %s", w.RequeueAfter, tc.requeue)
			}
		})
	}
}

// writtenAgo: raysync wrote the cluster's token d ago (its Secret's synced-at).
func writtenAgo(d time.Duration) func(*ClusterInput) {
	return func(in *ClusterInput) {
		in.Target.Annotations[names.SyncedAtAnnotation] = planNow.Add(-d).UTC().Format(time.RFC3339Nano)
	}
}

// Every restart raysync starts has a way forward: a cluster it cannot move is never suspended, and one
// suspended that cannot finish is resumed (Event RotationAbandoned) and frees its slot of the wave.
func TestWaveNeverLeavesAClusterSuspended(t *testing.T) {
	cfg := Config{Source: tokenSrc, Rotation: RotationOptions{MaxConcurrent: 2, Timeout: time.Hour}}.withDefaults()
	started := func(ago time.Duration) func(*unstructured.Unstructured) {
		return annotated(names.RotationStartedAnnotation, planNow.Add(-ago).Format(time.RFC3339))
	}
	inFlight := func(ago time.Duration) []func(*unstructured.Unstructured) {
		return []func(*unstructured.Unstructured){started(ago), annotated(names.RotationTargetAnnotation, "7"), setPath(true, "spec", "suspend")}
	}
	sharesCopy := func(opts ...func(*unstructured.Unstructured)) *unstructured.Unstructured {
		return rayCluster("share-a", append([]func(*unstructured.Unstructured){withAuth(map[string]any{"mode": "token", "secretName": "shared"}), resourceVersion("3")}, opts...)...)
	}
	// share-a names the managed copy "shared", which share-b's running head reads too.
	sharedView := func(rc *unstructured.Unstructured, opts ...func(*ClusterInput)) clusterView {
		copyOf := secret(ns, "shared", map[string]string{"auth_token": oldToken}, managed)
		all := append([]func(*ClusterInput){target(copyOf), pods(startedPod("share-a-head", "share-a", planNow.Add(-5*time.Hour), headPod)),
			readers(startedPod("share-b-head", "share-b", planNow.Add(-5*time.Hour), headPod)), sharedWith("share-b"), withRotation}, opts...)
		in := input(cfg, rc, []*corev1.Secret{sourceSecret(token)}, all...)
		return clusterView{in: in, plan: planCluster(in, cfg)}
	}
	tests := map[string]struct {
		views    func() []clusterView
		want     []string
		inFlight int
	}{
		"`syncer rotate` on a held cluster sharing a managed copy with running clusters: the request is removed, nothing is suspended": {
			views: func() []clusterView {
				return []clusterView{sharedView(sharesCopy(annotated(names.RotateAnnotation, "now")))}
			},
			want: []string{"patch RayCluster share-a", "event RotationNotNeeded share-a"},
		},
		"restart policy on a cluster sharing a managed copy: never started": {
			views: func() []clusterView {
				return []clusterView{sharedView(sharesCopy(annotated(names.RotationAnnotation, names.PolicyRestart)))}
			},
		},
		"suspended, every pod gone, its Secret kept on the old token for a running sharer: resumed at once": {
			views: func() []clusterView { return []clusterView{sharedView(sharesCopy(inFlight(time.Minute)...), pods())} },
			want:  []string{"abandon RayCluster share-a", "event RotationAbandoned share-a"},
		},
		"suspended, every pod gone, its Secret about to take the new token: the restart goes on": {
			views: func() []clusterView {
				return []clusterView{view(t, cfg, restartCluster("c1", inFlight(time.Minute)...), false, pods())}
			},
			inFlight: 1,
		},
		"suspended, every pod gone, its Secret no longer raysync's: resumed at once": {
			views: func() []clusterView {
				return []clusterView{view(t, cfg, restartCluster("c1", inFlight(time.Minute)...), false, pods(), func(in *ClusterInput) {
					in.Target = secret(ns, "c1", map[string]string{"auth_token": oldToken}, ownedBy("someone-else"))
				})}
			},
			want: []string{"abandon RayCluster c1", "event RotationAbandoned c1"},
		},
		"suspended, every pod gone, the source unusable for a moment: the restart waits": {
			views: func() []clusterView {
				rc := restartCluster("c1", inFlight(time.Minute)...)
				in := input(cfg, rc, []*corev1.Secret{sourceSecret(" bad ")}, withRotation,
					target(secret(ns, "c1", map[string]string{"auth_token": oldToken}, ownedBy("c1"))))
				return []clusterView{{in: in, plan: planCluster(in, cfg)}}
			},
			inFlight: 1,
		},
		"suspended, every pod gone, its Secret deleted and left to KubeRay to create: the restart waits": {
			views: func() []clusterView {
				c := cfg
				c.NoPrecreate = true
				in := input(c, restartCluster("c1", inFlight(time.Minute)...), []*corev1.Secret{sourceSecret(token)}, withRotation)
				return []clusterView{{in: in, plan: planCluster(in, c)}}
			},
			inFlight: 1,
		},
		"suspended past --rotation-timeout with pods left: resumed on the token it had, and the wave goes on": {
			views: func() []clusterView {
				return []clusterView{view(t, cfg, restartCluster("c1", inFlight(2*time.Hour)...), false), view(t, cfg, restartCluster("c2"), false)}
			},
			want:     []string{"abandon RayCluster c1", "event RotationAbandoned c1", "start RayCluster c2", "event RotationStarted c2"},
			inFlight: 1,
		},
		"suspended, and raysync no longer manages the cluster: resumed at once": {
			views: func() []clusterView {
				rc := restartCluster("c1", append(inFlight(time.Minute), annotated(names.SkipAnnotation, "true"))...)
				return []clusterView{{in: input(cfg, rc, []*corev1.Secret{sourceSecret(token)}, withRotation), released: true}}
			},
			want: []string{"abandon RayCluster c1", "event RotationAbandoned c1"},
		},
		"restart abandoned for the current rotation: its policy does not start it again": {
			views: func() []clusterView {
				return []clusterView{view(t, cfg, restartCluster("c1", annotated(names.RotationAbandonedAnnotation, "7")), false)}
			},
		},
		"restart abandoned for the current rotation, then `syncer rotate`: started": {
			views: func() []clusterView {
				return []clusterView{view(t, cfg, restartCluster("c1", annotated(names.RotationAbandonedAnnotation, "7"), annotated(names.RotateAnnotation, "now")), false)}
			},
			want: []string{"start RayCluster c1", "event RotationStarted c1"}, inFlight: 1,
		},
		"restart abandoned for an earlier rotation: its policy starts it": {
			views: func() []clusterView {
				return []clusterView{view(t, cfg, restartCluster("c1", annotated(names.RotationAbandonedAnnotation, "6")), false)}
			},
			want: []string{"start RayCluster c1", "event RotationStarted c1"}, inFlight: 1,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			w := planWave(tc.views(), cfg, planNow, nil)
			if diff := cmp.Diff(tc.want, kinds(w.Actions)); diff != "" {
				t.Errorf("actions (-want +got):\n%s", diff)
			}
			if w.InFlight != tc.inFlight || w.Blocked {
				t.Errorf("in flight %d, blocked %v; want %d, false", w.InFlight, w.Blocked, tc.inFlight)
			}
		})
	}
}

func TestWaveWaitsForTheLedger(t *testing.T) {
	cfg := Config{Source: tokenSrc}.withDefaults()
	v := view(t, cfg, restartCluster("c1"), false)
	v.in.Sources.rotation = ledger.Rotation{}
	if w := planWave([]clusterView{v}, cfg, planNow, nil); len(w.Actions) != 0 {
		t.Errorf("started %v before the ledger numbered the token", kinds(w.Actions))
	}
}

// The exact patches: what raysync writes onto people's objects.
func TestRotationPatches(t *testing.T) {
	cfg := Config{Source: tokenSrc}.withDefaults()
	stamp := planNow.UTC().Format(time.RFC3339)
	restart := planWave([]clusterView{view(t, cfg, restartCluster("c1", annotated(names.RotateAnnotation, "x")), false)}, cfg, planNow, nil)
	checkPlan(t, ClusterPlan{Actions: restart.Actions[:1]}, []Action{PatchRotation{Kind: "RayCluster", Namespace: ns, Name: "c1", Starts: "restart",
		Patch: []byte(`{"metadata":{"resourceVersion":"3","annotations":{"raysync.dev/rotation-started":"` + stamp + `",
			"raysync.dev/rotation-target":"7","raysync.dev/rotate":null}},"spec":{"suspend":true}}`)}})
	replace := planWave([]clusterView{view(t, cfg, rayCluster("svc-a", ofRayService("svc")), false, owner(rayService("svc")))}, cfg, planNow, nil)
	checkPlan(t, ClusterPlan{Actions: replace.Actions[:1]}, []Action{PatchRotation{Kind: "RayService", Namespace: ns, Name: "svc", Starts: "replace",
		Patch: []byte(`{"apiVersion":"ray.io/v1","kind":"RayService","metadata":{"name":"svc","namespace":"ray",
			"annotations":{"raysync.dev/adopted":"` + adoptedAt + `","raysync.dev/rotation-started":"` + stamp + `","raysync.dev/rotation-target":"7"}},
			"spec":{"rayClusterConfig":{"headGroupSpec":{"template":{"metadata":{"annotations":{"raysync.dev/rotation-id":"7-` + fmt.Sprint(planNow.Unix()) + `"}}}}}}}`)}})
	// Completing keeps the template's value exactly (another value would start another upgrade), and
	// raysync's record of adopting the RayService (leaving it out would give it up).
	rs := rayService("svc", annotated(names.RotationStartedAnnotation, planNow.Add(-time.Minute).Format(time.RFC3339)), annotated(names.RotationTargetAnnotation, "7"),
		setPath("svc-b", "status", "activeServiceStatus", "rayClusterName"),
		setPath(map[string]any{names.RotationIDAnnotation: "7-123"}, "spec", "rayClusterConfig", "headGroupSpec", "template", "metadata", "annotations"))
	b := rayCluster("svc-b", ofRayService("svc"), func(u *unstructured.Unstructured) { u.SetCreationTimestamp(metav1.NewTime(planNow)) })
	done := planWave([]clusterView{view(t, cfg, b, true, owner(rs))}, cfg, planNow, nil)
	checkPlan(t, ClusterPlan{Actions: done.Actions[:1]}, []Action{PatchRotation{Kind: "RayService", Namespace: ns, Name: "svc", Completes: time.Minute,
		Patch: []byte(`{"apiVersion":"ray.io/v1","kind":"RayService","metadata":{"name":"svc","namespace":"ray","annotations":{"raysync.dev/adopted":"` + adoptedAt + `"}},
			"spec":{"rayClusterConfig":{"headGroupSpec":{"template":{"metadata":{"annotations":{"raysync.dev/rotation-id":"7-123"}}}}}}}`)}})
	for _, a := range append(restart.Actions, replace.Actions...) {
		if p, ok := a.(PatchRotation); ok && strings.Contains(string(p.Patch), token) {
			t.Fatal("a rotation patch carries the token")
		}
	}
}

// The exact patch that gives up a restart: raysync's marks go, the cluster resumes, and the rotation
// it was restarted for is recorded so its policy does not start it again for that rotation.
func TestAbandonPatch(t *testing.T) {
	cfg := Config{Source: tokenSrc, Rotation: RotationOptions{Timeout: time.Hour}}.withDefaults()
	rc := restartCluster("c1", annotated(names.RotationStartedAnnotation, planNow.Add(-2*time.Hour).Format(time.RFC3339)),
		annotated(names.RotationTargetAnnotation, "7"), setPath(true, "spec", "suspend"))
	w := planWave([]clusterView{view(t, cfg, rc, false)}, cfg, planNow, nil)
	checkPlan(t, ClusterPlan{Actions: w.Actions[:1]}, []Action{PatchRotation{Kind: "RayCluster", Namespace: ns, Name: "c1", Abandons: names.AbandonTimeout,
		Patch: []byte(`{"metadata":{"resourceVersion":"3","annotations":{"raysync.dev/rotation-started":null,"raysync.dev/rotation-target":null,
			"raysync.dev/rotation-blocked":null,"raysync.dev/rotation-abandoned":"7"}},"spec":{"suspend":false}}`)}})
	// Starting again (on request) takes the abandoned mark away.
	again := restartCluster("c1", annotated(names.RotationAbandonedAnnotation, "7"), annotated(names.RotateAnnotation, "now"))
	w = planWave([]clusterView{view(t, cfg, again, false)}, cfg, planNow, nil)
	stamp := planNow.UTC().Format(time.RFC3339)
	checkPlan(t, ClusterPlan{Actions: w.Actions[:1]}, []Action{PatchRotation{Kind: "RayCluster", Namespace: ns, Name: "c1", Starts: "restart",
		Patch: []byte(`{"metadata":{"resourceVersion":"3","annotations":{"raysync.dev/rotation-started":"` + stamp + `",
			"raysync.dev/rotation-target":"7","raysync.dev/rotate":null,"raysync.dev/rotation-abandoned":null}},"spec":{"suspend":true}}`)}})
}

// A cluster raysync was restarting and then let go (annotated raysync.dev/skip): the controller's
// wave resumes it, with a Warning and the metric.
func TestWaveResumesAClusterItLetGo(t *testing.T) {
	rc := restartCluster("c1", annotated(names.RotationStartedAnnotation, planNow.Add(-time.Minute).Format(time.RFC3339)),
		annotated(names.RotationTargetAnnotation, "7"), setPath(true, "spec", "suspend"), annotated(names.SkipAnnotation, "true"))
	h := newHarnessWith(t, Config{Source: tokenSrc}, []*unstructured.Unstructured{rc}, sourceSecret(token))
	if err := h.ctrl.syncWave(context.Background()); err != nil {
		t.Fatal(err)
	}
	var patches []string
	for _, a := range h.dyn.Actions() {
		if p, ok := a.(clienttesting.PatchAction); ok {
			patches = append(patches, p.GetName()+" "+string(p.GetPatch()))
		}
	}
	want := []string{`c1 {"metadata":{"annotations":{"raysync.dev/rotation-abandoned":"7","raysync.dev/rotation-blocked":null,"raysync.dev/rotation-started":null,"raysync.dev/rotation-target":null},"resourceVersion":"3"},"spec":{"suspend":false}}`}
	if diff := cmp.Diff(want, patches); diff != "" {
		t.Errorf("patches (-want +got):\n%s", diff)
	}
	if ev := h.events(); len(ev) != 1 || !strings.Contains(ev[0], "Warning RotationAbandoned") {
		t.Errorf("events %v", ev)
	}
	if v := testutilValue(h.metrics.RotationsAbandoned.WithLabelValues(names.AbandonUnmanaged)); v != 1 {
		t.Errorf("raysync_rotations_abandoned_total{reason=unmanaged} = %v", v)
	}
}

// A RayService's cluster is only ever replaced, never restarted: whatever its policy (a restart falls
// back to hold: the replacement keeps its traffic served) and on request too. So a blocked rotation
// of kind RayService is a replacement (the old cluster serves) and one of kind RayCluster or RayJob a
// restart (the cluster is down): RaysyncRotationBlocked's severity by kind is exact, and
// raysync_rotation_clusters needs no action label to tell them apart.
func TestARayServicesClusterIsOnlyEverReplaced(t *testing.T) {
	cfg := Config{Source: tokenSrc, Rotation: RotationOptions{MaxConcurrent: 5, Timeout: time.Hour}}.withDefaults()
	for _, policy := range []string{"", names.PolicyReplace, names.PolicyRestart, names.PolicyHold, names.PolicyGateway} {
		for _, requested := range []bool{false, true} {
			opts := []func(*unstructured.Unstructured){ofRayService("svc")}
			if policy != "" {
				opts = append(opts, annotated(names.RotationAnnotation, policy))
			}
			if requested {
				opts = append(opts, annotated(names.RotateAnnotation, "now"))
			}
			v := view(t, cfg, rayCluster("svc-x7k2p", opts...), false, owner(rayService("svc")))
			var starts []string
			for _, a := range kinds(planWave([]clusterView{v}, cfg, planNow, nil).Actions) {
				if strings.HasPrefix(a, "start ") {
					starts = append(starts, a)
				}
			}
			moves := requested || policy == "" || policy == names.PolicyReplace
			if want := []string{"start RayService svc"}; (moves && !slices.Equal(starts, want)) || (!moves && len(starts) > 0) {
				t.Errorf("policy %q, requested %v: %q; want a replacement of RayService svc (only if it moves)", policy, requested, starts)
			}
			if r := v.plan.Status.Rotation; r.Policy == names.PolicyRestart || (r.Move != "" && r.Move != names.PolicyReplace) {
				t.Errorf("policy %q, requested %v: policy %s, move %s", policy, requested, r.Policy, r.Move)
			}
		}
	}
}
