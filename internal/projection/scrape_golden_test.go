package projection

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/raysync/raysync/internal/kuberay"
)

var updateGolden = flag.Bool("update-golden", false, "rewrite testdata/scrape.golden from the current code")

// variedFleet is scrapeFleet's shape with every state the scrape reports somewhere in it: stale pods,
// a token behind, a target to create, one raysync does not own, a template patch deferred or due,
// clusters of RayServices and RayJobs.
func variedFleet(t testing.TB) *harness {
	return fleetOf(t, 40, func(i int, rc *unstructured.Unstructured, target *corev1.Secret, pods []*corev1.Pod) []runtime.Object {
		switch i % 10 {
		case 1: // running pods created before the template carried the pull secret
			for _, p := range pods {
				p.Spec.ImagePullSecrets = nil
			}
		case 2: // the target keeps the token its running containers read
			target.Data["auth_token"] = []byte(oldToken)
		case 3: // no target yet
			target.Name = ""
		case 4: // a Secret raysync does not own under the target's name
			target.Labels, target.OwnerReferences = nil, nil
		case 5: // a template patch that would restart running pods
			_ = unstructured.SetNestedField(rc.Object, "Recreate", "spec", "upgradeStrategy", "type")
			unstructured.RemoveNestedField(rc.Object, "spec", "headGroupSpec", "template", "spec", "imagePullSecrets")
		case 6: // a template patch due
			unstructured.RemoveNestedField(rc.Object, "spec", "headGroupSpec", "template", "spec", "imagePullSecrets")
		case 7:
			withLabel(kuberay.OriginatedFromCRDLabel, "RayService")(rc)
			withLabel(kuberay.OriginatedFromNameLabel, "svc")(rc)
		case 8:
			withLabel(kuberay.OriginatedFromCRDLabel, "RayJob")(rc)
			withLabel(kuberay.OriginatedFromNameLabel, "job")(rc)
			target.Data["auth_token"] = []byte(oldToken)
		case 9: // pods not started yet
			for _, p := range pods {
				p.Status = corev1.PodStatus{Phase: corev1.PodPending}
			}
		}
		return nil
	})
}

// clock-dependent values: the certificate's expiry, ages and times taken from time.Now in the fixtures.
var (
	unstableSample = regexp.MustCompile(`(?m)^((?:raysync_autoscaler_client_cert_expiry_timestamp_seconds|raysync_rotation_oldest_behind_seconds)(?:\{[^}]*\})?) [0-9.e+]+$`)
	timestamp      = regexp.MustCompile(`"\d{4}-\d\d-\d\dT[0-9:.]+Z"`)
)

// TestScrapeOutputUnchanged holds the scrape's exposition and `syncer status`'s answer over a varied
// fleet to testdata/scrape.golden, written from the code before the scrape was made cheaper: an
// optimisation must not change a byte of what Prometheus or an operator reads.
func TestScrapeOutputUnchanged(t *testing.T) {
	h := variedFleet(t)
	var out bytes.Buffer
	families, err := h.metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	state := map[string]bool{}
	for _, n := range []string{"raysync_source_valid", "raysync_target_in_sync", "raysync_targets", "raysync_stale_pods",
		"raysync_autoscaler_client_cert_expiry_timestamp_seconds", "raysync_template_deferred", "raysync_rotation_clusters",
		"raysync_rotation_oldest_behind_seconds"} {
		state[n] = true
	}
	for _, mf := range families {
		if state[mf.GetName()] {
			if _, err := expfmt.MetricFamilyToText(&out, mf); err != nil {
				t.Fatal(err)
			}
		}
	}
	sources, clusters := h.ctrl.reporter.Status()
	slices.SortFunc(clusters, func(a, b ClusterStatus) int { return strings.Compare(a.RayCluster, b.RayCluster) }) // cache order
	for _, v := range []any{sources, clusters} {
		b, err := json.MarshalIndent(v, "", " ")
		if err != nil {
			t.Fatal(err)
		}
		out.Write(b)
		out.WriteString("\n")
	}
	got := unstableSample.ReplaceAllString(out.String(), "$1 (clock)")
	got = timestamp.ReplaceAllString(got, `"(clock)"`)
	const path = "testdata/scrape.golden"
	if *updateGolden {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		gl, wl := strings.Split(got, "\n"), strings.Split(string(want), "\n")
		for i := range min(len(gl), len(wl)) {
			if gl[i] != wl[i] {
				t.Fatalf("scrape output differs from %s at line %d:\n got: %s\nwant: %s", path, i+1, gl[i], wl[i])
			}
		}
		t.Fatalf("scrape output differs from %s: %d lines, want %d", path, len(gl), len(wl))
	}
}

// TestSourceParsesFollowTheCachedObject: a new version of a source (a new object in the caches) is
// parsed again; the same object is not.
func TestSourceParsesFollowTheCachedObject(t *testing.T) {
	crt, key := testCert(t)
	n := types.NamespacedName{Namespace: tokenSrc.Namespace, Name: "tls"}
	good := &corev1.Secret{Data: map[string][]byte{"tls.crt": crt, "tls.key": key}}
	broken := &corev1.Secret{Data: map[string][]byte{"tls.crt": crt}}
	var m sourceParses
	now := time.Now()
	for i, tc := range []struct {
		s     *corev1.Secret
		valid bool
	}{{good, true}, {good, true}, {broken, false}, {good, true}, {nil, false}} {
		if _, err := m.tls(n, tc.s).At(now); (err == nil) != tc.valid {
			t.Errorf("step %d: err = %v, want valid %v", i, err, tc.valid)
		}
	}
	if _, err := m.tls(n, good).At(now.Add(48 * time.Hour)); err == nil {
		t.Error("a remembered certificate is still judged at the time asked: want expired")
	}
	l1 := secret(tokenSrc.Namespace, "ledger", nil)
	if _, err := m.ledger(l1); err == nil {
		t.Error("an unowned ledger Secret was read")
	}
	if l, err := m.ledger(nil); err != nil || l != nil {
		t.Errorf("no ledger Secret: %v %v", l, err)
	}
}
