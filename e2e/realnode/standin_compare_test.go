package realnode

import (
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	kptr "k8s.io/utils/ptr"

	"github.com/raysync/raysync/e2e/framework"
)

// TestStandInMatchesRealKubelet runs one table of pod shapes on the real node (kubelet v1.37.2,
// containerd 2) and then on the kubelet stand-in (its real-process mode, so that containers exit,
// crash and answer probes), and compares, step by step, what raysync's rules read from pod status:
// the phase (recycling), the Ready condition (waves), and per container the state, the waiting reason
// (the "before the env is read" reasons), started and startedAt (never split), the last termination;
// plus the restart count and the kubelet's event reasons. Every difference fails the test. The real
// kubelet's sequences of statuses are printed (REAL), the stand-in's too (STANDIN).
//
// Then a freshness step on both: with the kubelet's reflector for a Secret running, a container
// started right after the Secret's write reads the new value or the previous one (the stand-in in its
// model of the kubelet's Watch-based manager, standin.raysync.dev/secret-cache: watch). The two must
// agree round by round.
//
// Both control planes never run at once: the real node is stopped before the stand-in starts.
func TestStandInMatchesRealKubelet(t *testing.T) {
	if testing.Short() {
		t.Skip("e2e: skipped in -short mode")
	}
	var real, standIn map[string]shapeResult
	var realFresh, standInFresh []string
	t.Run("RealNode", func(t *testing.T) {
		cp := startNode(t)
		ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
		defer cancel()
		cache, err := framework.CacheDir()
		if err != nil {
			t.Fatal(err)
		}
		// The private image must not be the tiny image under another name: once the kubelet pulled an
		// image ID with credentials, a pod without them has to pull it again (KubeletEnsureSecretPulledImages),
		// and the tiny image, imported and never pulled, cannot be.
		pause, err := buildPauseForStandIn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		tar := filepath.Join(t.TempDir(), "private.tar")
		if out, err := exec.CommandContext(ctx, filepath.Join(cache, "bin", framework.ImageToolName), "single", "-binary", pause,
			"-entrypoint", "/private-pause", "-ref", "private/cmp:1", "-out", tar).CombinedOutput(); err != nil {
			t.Fatalf("build the private image: %v\n%s", err, out)
		}
		private, err := cp.PushImage(ctx, tar, "private/cmp:1")
		if err != nil {
			t.Fatal(err)
		}
		n := &cmpNode{kind: "REAL", kube: cp.Kube, ns: "kubelet-cmp", image: framework.TinyImage, privateImage: private,
			pullSecret: func(name string) (*corev1.Secret, error) { return cp.RegistryPullSecret("kubelet-cmp", name) },
			pause:      func(args ...string) ([]string, []string) { return nil, args }, pauseBinary: "/pause",
			firstOutput: func(ctx context.Context, pod string) (time.Time, error) {
				var first time.Time
				err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
					b, err := cp.Kube.CoreV1().Pods("kubelet-cmp").GetLogs(pod, &corev1.PodLogOptions{Timestamps: true}).DoRaw(ctx)
					if err != nil || len(b) == 0 {
						return false, nil
					}
					ts, _, _ := strings.Cut(string(b), " ")
					first, err = time.Parse(time.RFC3339Nano, ts)
					return err == nil, nil
				})
				return first, err
			}}
		real = runShapes(ctx, t, n)
		realFresh = freshness(ctx, t, n, nil, func(ctx context.Context, pod string, values []string) (string, error) {
			var v string
			err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
				b, err := cp.Kube.CoreV1().Pods(freshNS).GetLogs(pod, &corev1.PodLogOptions{}).DoRaw(ctx)
				_, after, ok := strings.Cut(string(b), freshVar+"=")
				v = strings.TrimSpace(strings.SplitN(after, "\n", 2)[0])
				return err == nil && ok, nil
			})
			return v, err
		})
		if err := cp.Stop(); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("StandIn", func(t *testing.T) {
		if framework.RealRayDisabled() {
			t.Skipf("the stand-in runs processes only with real Ray (%s=off)", framework.RealRayOff)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
		defer cancel()
		venv, err := framework.EnsureRay(ctx, t.Logf)
		if err != nil {
			t.Fatal(err)
		}
		pause, err := buildPauseForStandIn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		cp, err := framework.Start(ctx, framework.Options{KubeRayVersion: "v1.6.1", Logf: t.Logf,
			StandIn: framework.StandInOptions{RayVenv: venv}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cp.Stop() })
		const ns = "kubelet-cmp"
		n := &cmpNode{kind: "STANDIN", kube: cp.Kube, ns: ns, nsAnnotations: map[string]string{framework.StandInRay: "real"},
			image: framework.TinyImage, privateImage: framework.PrivateRegistry + "/private/tiny:1",
			pullSecret: func(name string) (*corev1.Secret, error) { return standInPullSecret(ns, name), nil },
			pause:      func(args ...string) ([]string, []string) { return []string{pause}, args }, pauseBinary: pause}
		standIn = runShapes(ctx, t, n)
		// The stand-in's model of the kubelet's Watch-based secret manager (the watch as fast as the
		// API server delivers it); what a container read is the fingerprint of its RAY_AUTH_TOKEN.
		standInFresh = freshness(ctx, t, n, map[string]string{framework.StandInSecretCache: "watch"},
			func(ctx context.Context, pod string, values []string) (string, error) {
				var v string
				err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
					starts, err := cp.Ray.Starts(ctx, freshNS)
					if err != nil {
						return false, nil
					}
					for _, st := range starts {
						if st.Pod != pod || st.TokenFingerprint == "" {
							continue
						}
						v = "a value never written"
						for _, want := range values {
							if cp.Ray.Fingerprint(want) == st.TokenFingerprint {
								v = want
							}
						}
						return true, nil
					}
					return false, nil
				})
				return v, err
			})
	})
	if real == nil || standIn == nil {
		t.Skip("comparison needs both halves")
	}
	if d := cmp.Diff(realFresh, standInFresh); d != "" {
		t.Errorf("a container started right after its Secret's write, the reflector already running: what it read (-real +stand-in):\n%s", d)
	}
	for _, s := range kubeletShapes {
		r, si := real[s.name], standIn[s.name]
		for _, res := range []*shapeResult{&r, &si} {
			res.waitingReasons = without(res.waitingReasons, s.racy)
			res.events = without(without(res.events, s.racy), racyEverywhere)
		}
		for i, st := range s.steps {
			if i >= len(r.steps) || i >= len(si.steps) {
				break
			}
			if d := cmp.Diff(r.steps[i], si.steps[i]); d != "" {
				t.Errorf("%s, step %s: the stand-in differs from the real kubelet (-real +stand-in):\n%s", s.name, st.name, d)
			}
		}
		if d := cmp.Diff(r.waitingReasons, si.waitingReasons); d != "" {
			t.Errorf("%s: waiting reasons seen (-real +stand-in):\n%s", s.name, d)
		}
		if d := cmp.Diff(r.events, si.events); d != "" {
			t.Errorf("%s: the kubelet's event reasons (-real +stand-in):\n%s", s.name, d)
		}
	}
}

// racyEverywhere are Event reasons the real kubelet gives any pod only sometimes: on a loaded machine
// its ConfigMap manager misses the 1 s it waits for a new reflector's first list, and mounting the
// service-account volume (kube-root-ca.crt) fails once (FailedMount "failed to sync configmap cache").
// The stand-in mounts no service-account volume.
var racyEverywhere = []string{"FailedMount"}

func without(list, drop []string) []string {
	return slices.DeleteFunc(slices.Clone(list), func(v string) bool { return slices.Contains(drop, v) })
}

// cmpNode is one kind of node the table runs on: the image and how to run the tiny program differ.
type cmpNode struct {
	kind          string
	kube          kubernetes.Interface
	ns            string
	nsAnnotations map[string]string
	image         string
	privateImage  string
	pullSecret    func(name string) (*corev1.Secret, error)
	// pause runs the tiny program (e2e/realnode/pause) with args: the image's entrypoint on the
	// real node, the same program built for the host on the stand-in.
	pause       func(args ...string) (command, argv []string)
	pauseBinary string // the program's path inside the container (exec probes)
	// firstOutput is when a pod's container wrote its first line (the runtime's log timestamp;
	// nil: no logs through the API server, as on the stand-in).
	firstOutput func(ctx context.Context, pod string) (time.Time, error)
}

// containerObs is one container as raysync's rules read it.
type containerObs struct {
	Name           string
	State          string // waiting, running, terminated
	Reason         string // the waiting or terminated reason
	ExitCode       int32
	LastTerminated string // "Reason/ExitCode" of the last termination, if any
	Started        bool
	StartedAtSet   bool
	RestartCount   int32
	Ready          bool
}

// podObs is a pod as raysync's rules read it.
type podObs struct {
	Gone       bool // the pod object was deleted
	Deleting   bool
	Bound      bool
	Phase      corev1.PodPhase
	Conditions []string // Type=Status, sorted
	Init       []containerObs
	Containers []containerObs
}

func observe(p *corev1.Pod) podObs {
	o := podObs{Deleting: p.DeletionTimestamp != nil, Bound: p.Spec.NodeName != "", Phase: p.Status.Phase}
	for _, c := range p.Status.Conditions {
		o.Conditions = append(o.Conditions, fmt.Sprintf("%s=%s", c.Type, c.Status))
	}
	sort.Strings(o.Conditions)
	conv := func(css []corev1.ContainerStatus) []containerObs {
		var out []containerObs
		for _, cs := range css {
			c := containerObs{Name: cs.Name, Started: kptr.Deref(cs.Started, false), RestartCount: cs.RestartCount, Ready: cs.Ready}
			switch {
			case cs.State.Running != nil:
				c.State, c.StartedAtSet = "running", !cs.State.Running.StartedAt.IsZero()
			case cs.State.Terminated != nil:
				c.State, c.Reason, c.ExitCode = "terminated", cs.State.Terminated.Reason, cs.State.Terminated.ExitCode
				c.StartedAtSet = !cs.State.Terminated.StartedAt.IsZero()
			case cs.State.Waiting != nil:
				c.State, c.Reason = "waiting", cs.State.Waiting.Reason
			}
			if lt := cs.LastTerminationState.Terminated; lt != nil {
				c.LastTerminated = fmt.Sprintf("%s/%d", lt.Reason, lt.ExitCode)
			}
			out = append(out, c)
		}
		return out
	}
	o.Init, o.Containers = conv(p.Status.InitContainerStatuses), conv(p.Status.ContainerStatuses)
	return o
}

func (o podObs) String() string {
	if o.Gone {
		return "gone"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "phase=%s bound=%t deleting=%t [%s]", o.Phase, o.Bound, o.Deleting, strings.Join(o.Conditions, " "))
	for _, c := range append(slices.Clone(o.Init), o.Containers...) {
		fmt.Fprintf(&b, " %s:%s", c.Name, c.State)
		if c.Reason != "" {
			fmt.Fprintf(&b, "(%s", c.Reason)
			if c.State == "terminated" {
				fmt.Fprintf(&b, ",%d", c.ExitCode)
			}
			b.WriteString(")")
		}
		fmt.Fprintf(&b, ",started=%t,startedAt=%t,restarts=%d,ready=%t", c.Started, c.StartedAtSet, c.RestartCount, c.Ready)
		if c.LastTerminated != "" {
			fmt.Fprintf(&b, ",last=%s", c.LastTerminated)
		}
	}
	return b.String()
}

// kubeletStep acts (optional), then waits until the pod satisfies until (nil pod: deleted) and
// records the pod at that moment.
type kubeletStep struct {
	name  string
	act   func(ctx context.Context, n *cmpNode) error
	until func(p *corev1.Pod) bool
}

type kubeletShape struct {
	// envReadWindow: the last step's container prints at once; the log shows for how long the API
	// still said the container waited (CreateContainerConfigError) after its env was read.
	envReadWindow bool
	name          string
	// racy are waiting and event reasons the real kubelet shows only sometimes: left out of the
	// comparison of what was seen (never out of the steps' observations).
	racy  []string
	setup func(ctx context.Context, n *cmpNode) error
	pod   func(n *cmpNode) *corev1.Pod
	steps []kubeletStep
}

type shapeResult struct {
	steps          []podObs
	waitingReasons []string // every waiting reason any container showed, sorted
	events         []string // the kubelet's event reasons for the pod, sorted, unique
}

// Predicates of steps.
func containerWaiting(init bool, reason string) func(*corev1.Pod) bool {
	return func(p *corev1.Pod) bool {
		css := p.Status.ContainerStatuses
		if init {
			css = p.Status.InitContainerStatuses
		}
		return len(css) > 0 && css[0].State.Waiting != nil && css[0].State.Waiting.Reason == reason
	}
}

func containerRunning(init bool) func(*corev1.Pod) bool {
	return func(p *corev1.Pod) bool {
		css := p.Status.ContainerStatuses
		if init {
			css = p.Status.InitContainerStatuses
		}
		return len(css) > 0 && css[0].State.Running != nil
	}
}

func podIsReady(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodRunning && slices.ContainsFunc(p.Status.Conditions, func(c corev1.PodCondition) bool {
		return c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue
	})
}

func podGone(p *corev1.Pod) bool { return p == nil }

func secretRef(name, key string, optional bool) *corev1.EnvVarSource {
	return &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: name},
		Key: key, Optional: kptr.To(optional)}}
}

func createSecret(name string, data map[string]string) func(ctx context.Context, n *cmpNode) error {
	return func(ctx context.Context, n *cmpNode) error {
		_, err := n.kube.CoreV1().Secrets(n.ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name}, StringData: data}, metav1.CreateOptions{})
		return err
	}
}

func createPullSecret(name string) func(ctx context.Context, n *cmpNode) error {
	return func(ctx context.Context, n *cmpNode) error {
		s, err := n.pullSecret(name)
		if err != nil {
			return err
		}
		_, err = n.kube.CoreV1().Secrets(n.ns).Create(ctx, s, metav1.CreateOptions{})
		return err
	}
}

// basePod is a Ray worker-shaped pod (the stand-in runs only Ray pods) running the tiny program.
func basePod(n *cmpNode, name string, args ...string) *corev1.Pod {
	cmd, a := n.pause(args...)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: n.ns,
			Labels: map[string]string{"ray.io/node-type": "worker", "ray.io/cluster": name}},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{Name: "main", Image: n.image, ImagePullPolicy: corev1.PullIfNotPresent, Command: cmd, Args: a}},
		},
	}
}

var kubeletShapes = []kubeletShape{
	{
		name:          "missing-secret",
		envReadWindow: true,
		pod: func(n *cmpNode) *corev1.Pod {
			p := basePod(n, "missing-secret", "env", "READY")
			c := &p.Spec.Containers[0]
			c.Env = []corev1.EnvVar{{Name: "TOKEN", ValueFrom: secretRef("absent", "k", false)}}
			c.EnvFrom = []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "absent"}}}}
			return p
		},
		steps: []kubeletStep{
			{name: "config-error", until: containerWaiting(false, "CreateContainerConfigError")},
			{name: "secret-created", act: createSecret("absent", map[string]string{"k": "v"}), until: podIsReady},
		},
	},
	{
		name:  "missing-key",
		setup: createSecret("partial", map[string]string{"other": "x"}),
		pod: func(n *cmpNode) *corev1.Pod {
			p := basePod(n, "missing-key")
			p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "TOKEN", ValueFrom: secretRef("partial", "k", false)}}
			return p
		},
		steps: []kubeletStep{
			{name: "config-error", until: containerWaiting(false, "CreateContainerConfigError")},
			{name: "key-added", act: func(ctx context.Context, n *cmpNode) error {
				_, err := n.kube.CoreV1().Secrets(n.ns).Update(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "partial"},
					StringData: map[string]string{"other": "x", "k": "v"}}, metav1.UpdateOptions{})
				return err
			}, until: podIsReady},
		},
	},
	{
		name: "optional",
		pod: func(n *cmpNode) *corev1.Pod {
			p := basePod(n, "optional")
			c := &p.Spec.Containers[0]
			c.Env = []corev1.EnvVar{{Name: "TOKEN", ValueFrom: secretRef("absent-optional", "k", true)}}
			c.EnvFrom = []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "absent-optional"}, Optional: kptr.To(true)}}}
			return p
		},
		steps: []kubeletStep{{name: "running", until: podIsReady}},
	},
	{
		name: "init-waits",
		pod: func(n *cmpNode) *corev1.Pod {
			p := basePod(n, "init-waits")
			cmd, args := n.pause("sleep", "4s")
			p.Spec.InitContainers = []corev1.Container{{Name: "wait", Image: n.image, ImagePullPolicy: corev1.PullIfNotPresent, Command: cmd, Args: args}}
			return p
		},
		steps: []kubeletStep{
			{name: "init-running", until: containerRunning(true)},
			{name: "running", until: podIsReady},
		},
	},
	{
		name: "init-missing-secret",
		pod: func(n *cmpNode) *corev1.Pod {
			p := basePod(n, "init-missing-secret")
			cmd, args := n.pause("sleep", "1s")
			p.Spec.InitContainers = []corev1.Container{{Name: "wait", Image: n.image, ImagePullPolicy: corev1.PullIfNotPresent, Command: cmd, Args: args,
				Env: []corev1.EnvVar{{Name: "TOKEN", ValueFrom: secretRef("init-token", "k", false)}}}}
			return p
		},
		steps: []kubeletStep{
			{name: "init-config-error", until: containerWaiting(true, "CreateContainerConfigError")},
			{name: "secret-created", act: createSecret("init-token", map[string]string{"k": "v"}), until: podIsReady},
		},
	},
	{
		name: "private-image-without-credentials",
		pod: func(n *cmpNode) *corev1.Pod {
			p := basePod(n, "private-no-creds")
			p.Spec.Containers[0].Image, p.Spec.Containers[0].ImagePullPolicy = n.privateImage, corev1.PullAlways
			p.Spec.ImagePullSecrets = []corev1.LocalObjectReference{{Name: "regcred-late"}}
			return p
		},
		steps: []kubeletStep{
			{name: "pull-back-off", until: containerWaiting(false, "ImagePullBackOff")},
			{name: "credentials-created", act: createPullSecret("regcred-late"), until: podIsReady},
		},
	},
	{
		name:  "private-image-with-credentials",
		setup: createPullSecret("regcred"),
		// The kubelet reads pull Secrets through its watch-based manager, which waits at most 1 s for a
		// new reflector's first list: for a pod created right after its pull Secret, that can time
		// out (FailedToRetrieveImagePullSecret), and the first pull goes without credentials and fails.
		racy: []string{"ErrImagePull", "ImagePullBackOff", "BackOff", "Failed", "FailedToRetrieveImagePullSecret"},
		pod: func(n *cmpNode) *corev1.Pod {
			p := basePod(n, "private-creds")
			p.Spec.Containers[0].Image, p.Spec.Containers[0].ImagePullPolicy = n.privateImage, corev1.PullAlways
			p.Spec.ImagePullSecrets = []corev1.LocalObjectReference{{Name: "regcred"}}
			return p
		},
		steps: []kubeletStep{{name: "running", until: podIsReady}},
	},
	{
		name: "readiness-probe",
		pod: func(n *cmpNode) *corev1.Pod {
			p := basePod(n, "readiness")
			p.Spec.Containers[0].ReadinessProbe = &corev1.Probe{InitialDelaySeconds: 3, PeriodSeconds: 1,
				ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{n.pauseBinary, "env", "-once"}}}}
			return p
		},
		steps: []kubeletStep{
			{name: "started-not-ready", until: containerRunning(false)},
			{name: "ready", until: podIsReady},
		},
	},
	{
		name: "crash",
		pod:  func(n *cmpNode) *corev1.Pod { return basePod(n, "crash", "exit", "3") },
		steps: []kubeletStep{
			{name: "first-back-off", until: containerWaiting(false, "CrashLoopBackOff")},
		},
	},
	{
		name: "graceful-deletion",
		pod:  func(n *cmpNode) *corev1.Pod { return basePod(n, "deletion") },
		steps: []kubeletStep{
			{name: "running", until: podIsReady},
			{name: "deleted", act: func(ctx context.Context, n *cmpNode) error {
				// Give the program time to install its SIGTERM handler: the stand-in reports a container
				// running as soon as its process exists, and a SIGTERM before the handler kills it (143).
				time.Sleep(time.Second)
				return n.kube.CoreV1().Pods(n.ns).Delete(ctx, "deletion", metav1.DeleteOptions{})
			}, until: podGone},
		},
	},
}

// runShapes runs every shape on n, side by side, and returns what each step observed.
func runShapes(ctx context.Context, t *testing.T, n *cmpNode) map[string]shapeResult {
	t.Helper()
	if _, err := n.kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n.ns, Annotations: n.nsAnnotations}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitServiceAccount(ctx, t, n.kube, n.ns)
	var mu sync.Mutex
	results := map[string]shapeResult{}
	var wg sync.WaitGroup
	for _, s := range kubeletShapes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, log, err := runShape(ctx, n, s)
			mu.Lock()
			defer mu.Unlock()
			t.Logf("%s %s:\n%s", n.kind, s.name, log)
			if err != nil {
				t.Errorf("%s %s: %v", n.kind, s.name, err)
			}
			results[s.name] = r
		}()
	}
	wg.Wait()
	return results
}

func runShape(ctx context.Context, n *cmpNode, s kubeletShape) (shapeResult, string, error) {
	var r shapeResult
	var log strings.Builder
	pod := s.pod(n)
	if s.setup != nil {
		if err := s.setup(ctx, n); err != nil {
			return r, "", fmt.Errorf("setup: %w", err)
		}
	}
	w, err := n.kube.CoreV1().Pods(n.ns).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + pod.Name})
	if err != nil {
		return r, "", err
	}
	defer w.Stop()
	t0 := time.Now()
	if _, err := n.kube.CoreV1().Pods(n.ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return r, "", err
	}
	reasons := map[string]bool{}
	var last string
	record := func(o podObs) {
		if s := o.String(); s != last {
			last = s
			fmt.Fprintf(&log, "  %6.1fs %s\n", time.Since(t0).Seconds(), s)
		}
		for _, c := range append(slices.Clone(o.Init), o.Containers...) {
			if c.State == "waiting" {
				reasons[c.Reason] = true
			}
		}
	}
	for _, st := range s.steps {
		if st.act != nil {
			fmt.Fprintf(&log, "  %6.1fs -- %s\n", time.Since(t0).Seconds(), st.name)
			if err := st.act(ctx, n); err != nil {
				return r, log.String(), fmt.Errorf("step %s: %w", st.name, err)
			}
		}
		var got *podObs
		for got == nil {
			var ev watch.Event
			var ok bool
			select {
			case ev, ok = <-w.ResultChan():
			case <-ctx.Done():
				return r, log.String(), fmt.Errorf("step %s: %w", st.name, ctx.Err())
			}
			if !ok {
				return r, log.String(), fmt.Errorf("step %s: the watch ended", st.name)
			}
			p, isPod := ev.Object.(*corev1.Pod)
			if !isPod {
				return r, log.String(), fmt.Errorf("step %s: watch event %s %T", st.name, ev.Type, ev.Object)
			}
			o := observe(p)
			record(o)
			if ev.Type == watch.Deleted {
				if !st.until(nil) {
					return r, log.String(), fmt.Errorf("step %s: the pod was deleted", st.name)
				}
				// What a deleted pod leaves is its last status: record that.
				got = &o
				continue
			}
			if st.until(p) {
				got = &o
			}
		}
		seen := time.Now()
		fmt.Fprintf(&log, "  %6.1fs == %s\n", time.Since(t0).Seconds(), st.name)
		r.steps = append(r.steps, *got)
		if s.envReadWindow && n.firstOutput != nil && len(r.steps) == len(s.steps) {
			if out, err := n.firstOutput(ctx, pod.Name); err == nil {
				fmt.Fprintf(&log, "  MEASURE the container printed %s before the watch delivered its running status: the API said it waited for its env that long after the kubelet had read it\n",
					seen.Sub(out).Round(time.Millisecond))
			} else {
				fmt.Fprintf(&log, "  no first output: %v\n", err)
			}
		}
	}
	for k := range reasons {
		r.waitingReasons = append(r.waitingReasons, k)
	}
	sort.Strings(r.waitingReasons)
	// Events are sent asynchronously (and aggregated): give the last ones time to arrive.
	time.Sleep(3 * time.Second)
	evs, err := n.kube.CoreV1().Events(n.ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + pod.Name})
	if err != nil {
		return r, log.String(), err
	}
	seen := map[string]bool{}
	for _, e := range evs.Items {
		if e.Source.Component == "kubelet" || e.ReportingController == "kubelet" {
			seen[e.Reason] = true
			fmt.Fprintf(&log, "  event %s %s (x%d): %s\n", e.Type, e.Reason, max(e.Count, 1), e.Message)
		}
	}
	for k := range seen {
		r.events = append(r.events, k)
	}
	sort.Strings(r.events)
	return r, log.String(), nil
}

// buildPauseForStandIn builds the tiny program for the host: the stand-in runs it as a real process.
// It lives in the cache, as a container's private /tmp hides the test's temporary directories.
func buildPauseForStandIn(ctx context.Context) (string, error) {
	root, err := framework.RepoRoot()
	if err != nil {
		return "", err
	}
	cache, err := framework.CacheDir()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(cache, "bin", "standin-pause")
	tmp := fmt.Sprintf("%s.%d.tmp", bin, os.Getpid())
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", tmp, "./e2e/realnode/pause")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build the tiny program: %v\n%s", err, out)
	}
	return bin, os.Rename(tmp, bin)
}

// standInPullSecret holds credentials for the stand-in's private registry (it checks the host only).
func standInPullSecret(ns, name string) *corev1.Secret {
	cfg := fmt.Sprintf(`{"auths":{%q:{"username":"u","password":"p"}}}`, framework.PrivateRegistry)
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Type: corev1.SecretTypeDockerConfigJson,
		Data: map[string][]byte{corev1.DockerConfigJsonKey: []byte(cfg)}}
}

// freshNS and freshVar are the freshness step's namespace and the variable its pods read.
const (
	freshNS  = "kubelet-fresh"
	freshVar = "RAY_AUTH_TOKEN"
)

// freshness is TestRealNodeSecretCacheStaleness's watched case on one node: a long-running pod keeps
// the kubelet's reflector for Secret "fresh" running; each round writes the Secret and at once creates
// a pod whose container reads it (as a restart writes the token, then lets KubeRay create the pods).
// It returns, per round, "fresh" or "stale (<value>)": what the container started with. read says
// which of values a pod's container read.
func freshness(ctx context.Context, t *testing.T, node *cmpNode, annotations map[string]string,
	read func(ctx context.Context, pod string, values []string) (string, error)) []string {
	t.Helper()
	n := *node
	n.ns, n.nsAnnotations = freshNS, maps.Clone(node.nsAnnotations)
	if n.nsAnnotations == nil {
		n.nsAnnotations = map[string]string{}
	}
	maps.Copy(n.nsAnnotations, annotations)
	kube := n.kube
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: freshNS, Annotations: n.nsAnnotations}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitServiceAccount(ctx, t, kube, freshNS)
	values := []string{"fresh-gen-0"}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "fresh", Namespace: freshNS}, StringData: map[string]string{"v": values[0]}}
	if _, err := kube.CoreV1().Secrets(freshNS).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := func(name string, args ...string) *corev1.Pod {
		p := basePod(&n, name, args...)
		p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: freshVar, ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: "fresh"}, Key: "v"}}}}
		return p
	}
	if _, err := kube.CoreV1().Pods(freshNS).Create(ctx, pod("keeper", "sleep", "1h"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPodRunning(ctx, t, kube, freshNS, "keeper")
	var out []string
	for i := 1; i <= 5; i++ {
		v := fmt.Sprintf("fresh-gen-%d", i)
		values = append(values, v)
		secret.StringData = map[string]string{"v": v}
		if _, err := kube.CoreV1().Secrets(freshNS).Update(ctx, secret, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		name := fmt.Sprintf("reader-%d", i)
		if _, err := kube.CoreV1().Pods(freshNS).Create(ctx, pod(name, "env", freshVar), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		got, err := read(ctx, name, values)
		if err != nil {
			t.Fatalf("%s: what %s read: %v", n.kind, name, err)
		}
		if got == v {
			out = append(out, "fresh")
		} else {
			out = append(out, "stale ("+got+")")
		}
	}
	t.Logf("MEASURE %s freshness (a container started right after its Secret's write, the reflector running): %v", n.kind, out)
	return out
}
