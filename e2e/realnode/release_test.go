package realnode

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"debug/elf"
	"debug/macho"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/raysync/raysync/e2e/framework"
)

// TestRealNodeRelease cuts a release as docs/contributing/releasing.md says, into the node's registry
// (REGISTRY given with a trailing slash, as people paste it): the image index holds exactly linux/amd64
// and linux/arm64, each an ELF /syncer of its architecture; the darwin binaries are Mach-O of theirs;
// SHA256SUMS matches; the SBOM names the modules at go.mod's versions; `syncer version` prints the
// version. Then the quick start of docs/getting-started/helm.md runs as written (steps 2 to 6, the
// registry's name and the version substituted) on a cluster that already runs a RayService of the
// private Ray image: `helm install oci://…/charts/raysync --version` with only the required values (and
// the pull secret the page says a registry with credentials needs) pulls the amd64 image by the
// chart's default repository and rolls out; `kubectl exec deploy/raysync -- /syncer status` exits 1
// with the RayService not adopted, and installing moved it not; the adoption's dry run, then the
// adoption, replace it onto the canonical token, which step 6's digests show.
func TestRealNodeRelease(t *testing.T) {
	cp := startNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	root, err := framework.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	version, err := framework.ChartVersion()
	if err != nil {
		t.Fatal(err)
	}
	// Credentials as for any registry: a Docker config.json, which helm also reads.
	tmp := t.TempDir()
	pull, err := cp.RegistryPullSecret("raysync", "regcred")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(tmp, "docker"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tmp, "docker/config.json"), pull.Data[corev1.DockerConfigJsonKey], 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("DOCKER_CONFIG", filepath.Join(tmp, "docker"))
	ca := filepath.Join(cp.Dir, "ca.crt")
	dist := filepath.Join(tmp, "dist")
	registry := framework.RegistryPush + "/release"

	t0 := time.Now()
	cmd := exec.CommandContext(ctx, "go", "run", "./tools/release", "-version", version, "-registry", registry+"/", "-dist", dist, "-ca-file", ca)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+tmp+"/helm/cache", "HELM_CONFIG_HOME="+tmp+"/helm/config", "HELM_DATA_HOME="+tmp+"/helm/data")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make release: %v\n%s", err, out)
	}
	t.Logf("MEASURE release (4 binaries, SBOMs, image index, chart) in %s:\n%s", time.Since(t0).Round(time.Millisecond), out)

	// The image index, read back from the registry.
	reg := registryClient(t, ca, pull.Data[corev1.DockerConfigJsonKey])
	var index struct {
		MediaType string `json:"mediaType"`
		Manifests []struct {
			Digest   string `json:"digest"`
			Platform struct{ OS, Architecture string }
		} `json:"manifests"`
		Annotations map[string]string `json:"annotations"`
	}
	reg.getJSON(t, "release/raysync/manifests/"+version, "application/vnd.oci.image.index.v1+json", &index)
	var platforms []string
	for _, m := range index.Manifests {
		platforms = append(platforms, m.Platform.OS+"/"+m.Platform.Architecture)
	}
	sort.Strings(platforms)
	if index.MediaType != "application/vnd.oci.image.index.v1+json" || strings.Join(platforms, ",") != "linux/amd64,linux/arm64" {
		t.Fatalf("index %s with %v, want an OCI index of exactly linux/amd64 and linux/arm64", index.MediaType, platforms)
	}
	if index.Annotations["org.opencontainers.image.version"] != version {
		t.Errorf("index annotations %v", index.Annotations)
	}
	machines := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}
	for _, m := range index.Manifests {
		var manifest struct {
			Config struct{ Digest string }
			Layers []struct{ Digest string }
		}
		reg.getJSON(t, "release/raysync/manifests/"+m.Digest, "application/vnd.oci.image.manifest.v1+json", &manifest)
		var config struct {
			OS, Architecture string
			Config           struct {
				User       string
				Entrypoint []string
				Labels     map[string]string
			}
		}
		reg.getJSON(t, "release/raysync/blobs/"+manifest.Config.Digest, "", &config)
		c := config.Config
		if config.Architecture != m.Platform.Architecture || c.User != "65532:65532" || strings.Join(c.Entrypoint, " ") != "/syncer" ||
			c.Labels["org.opencontainers.image.version"] != version || !regexp.MustCompile(`^[0-9a-f]{40}(-dirty)?$`).MatchString(c.Labels["org.opencontainers.image.revision"]) ||
			c.Labels["org.opencontainers.image.source"] == "" {
			t.Errorf("%s config: %+v", m.Platform.Architecture, config)
		}
		if len(manifest.Layers) != 1 {
			t.Fatalf("%s: %d layers, want 1", m.Platform.Architecture, len(manifest.Layers))
		}
		files := layerFiles(t, reg.get(t, "release/raysync/blobs/"+manifest.Layers[0].Digest, ""))
		bin, ok := files["syncer"]
		if !ok || len(files) != 1 {
			t.Fatalf("%s layer holds %v, want only syncer", m.Platform.Architecture, keys(files))
		}
		f, err := elf.NewFile(bytes.NewReader(bin))
		if err != nil {
			t.Fatalf("%s /syncer: %v", m.Platform.Architecture, err)
		}
		if f.Machine != machines[m.Platform.Architecture] {
			t.Errorf("%s /syncer is an ELF for %s", m.Platform.Architecture, f.Machine)
		}
	}

	// dist/: the binaries, their sums, their SBOMs.
	for name, cpu := range map[string]macho.Cpu{"syncer-darwin-amd64": macho.CpuAmd64, "syncer-darwin-arm64": macho.CpuArm64} {
		f, err := macho.Open(filepath.Join(dist, name))
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if f.Cpu != cpu {
			t.Errorf("%s: Mach-O for %s", name, f.Cpu)
		}
		f.Close()
	}
	for name, m := range map[string]elf.Machine{"syncer-linux-amd64": elf.EM_X86_64, "syncer-linux-arm64": elf.EM_AARCH64} {
		if f, err := elf.Open(filepath.Join(dist, name)); err != nil || f.Machine != m {
			t.Errorf("%s: %v, want an ELF for %s", name, err, m)
		}
	}
	sums, err := os.ReadFile(filepath.Join(dist, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(sums))
	for sc.Scan() {
		sum, name, ok := strings.Cut(sc.Text(), "  ")
		b, err := os.ReadFile(filepath.Join(dist, name))
		got := sha256.Sum256(b)
		if !ok || err != nil || hex.EncodeToString(got[:]) != sum {
			t.Errorf("SHA256SUMS line %q does not match (%v)", sc.Text(), err)
		}
		listed[name] = true
	}
	entries, _ := os.ReadDir(dist)
	for _, e := range entries {
		if e.Name() != "SHA256SUMS" && !listed[e.Name()] {
			t.Errorf("%s is not in SHA256SUMS", e.Name())
		}
	}
	for _, want := range []string{"syncer-linux-amd64", "syncer-linux-arm64", "syncer-darwin-amd64", "syncer-darwin-arm64",
		"syncer-linux-amd64.cdx.json", "raysync-" + version + ".tgz"} {
		if !listed[want] {
			t.Errorf("SHA256SUMS lacks %s", want)
		}
	}
	var sbom struct {
		Components []struct{ Name, Version string }
	}
	b, err := os.ReadFile(filepath.Join(dist, "syncer-linux-amd64.cdx.json"))
	if err == nil {
		err = json.Unmarshal(b, &sbom)
	}
	if err != nil {
		t.Fatal(err)
	}
	inSBOM := map[string]string{}
	for _, c := range sbom.Components {
		inSBOM[c.Name] = c.Version
	}
	gomod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	for _, mod := range []string{"k8s.io/client-go", "github.com/prometheus/client_golang"} {
		want := regexp.MustCompile(`(?m)^\s+` + regexp.QuoteMeta(mod) + ` (\S+)`).FindSubmatch(gomod)
		if want == nil || inSBOM[mod] != string(want[1]) {
			t.Errorf("SBOM: %s at %q, go.mod: %q", mod, inSBOM[mod], want)
		}
	}
	v, err := exec.CommandContext(ctx, filepath.Join(dist, "syncer-linux-amd64"), "version").CombinedOutput()
	if err != nil || !strings.HasPrefix(string(v), "syncer "+version+" (commit ") {
		t.Errorf("syncer version: %v: %q, want syncer %s (commit …", err, v, version)
	}

	// The quick start (docs/getting-started/helm.md) as written, steps 2 to 6, on a cluster that
	// already runs a RayService: step 1 is the release above into this registry, whose name replaces
	// the page's registry.example.com/platform and whose version its 0.2.0. The reader is logged in to
	// the registry as for docker push (DOCKER_CONFIG, which helm reads as its registry config too) and
	// trusts its CA (SSL_CERT_FILE); the registry needs credentials, so step 3 gets the pull secret the
	// page says to add. The chart's image defaults to the released one.
	ns := "raysync"
	image, err := cp.PushRayImage(ctx, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	fleet := runningFleet(ctx, t, cp, "ml-team", image)
	kubectl, err := framework.Kubectl(ctx, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	helm, err := framework.EnsureHelm(ctx, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(tmp, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, path := range map[string]string{"kubectl": kubectl, "helm": helm} {
		if err := os.Symlink(path, filepath.Join(bin, name)); err != nil {
			t.Fatal(err)
		}
	}
	reader := append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"), "KUBECONFIG="+cp.Kubeconfig, "SSL_CERT_FILE="+ca,
		"HELM_CACHE_HOME="+tmp+"/helm/cache", "HELM_CONFIG_HOME="+tmp+"/helm/config", "HELM_DATA_HOME="+tmp+"/helm/data",
		"HELM_REGISTRY_CONFIG="+filepath.Join(tmp, "docker", "config.json"))
	// Nothing the steps print about the token reaches the test's output: not the token, not its digest.
	redact := func(s string) string { return s }
	step := func(n int, block string) (string, int) {
		t.Helper()
		block = strings.ReplaceAll(block, "registry.example.com/platform", registry)
		block = strings.ReplaceAll(block, "--version 0.2.0", "--version "+version)
		t.Logf("quick start step %d:\n%s", n, block)
		cmd := exec.CommandContext(ctx, "bash", "-c", block) // without -e, as a reader pastes it
		cmd.Env = reader
		out, err := cmd.CombinedOutput()
		code := 0
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			code = exit.ExitCode()
		} else if err != nil {
			t.Fatalf("step %d: %v", n, err)
		}
		t.Logf("exit %d:\n%s", code, redact(string(out)))
		return string(out), code
	}
	blocks, err := framework.DocsBlocks("getting-started/helm.md", "quickstart")
	if err != nil {
		t.Fatal(err)
	}
	if len(blocks) != 6 || !strings.Contains(blocks[0], "make release VERSION=0.2.0 REGISTRY=registry.example.com/platform") {
		t.Fatalf("the quick start has %d blocks and step 1 %q: this test runs steps 2-6 after the release above", len(blocks), blocks[0])
	}
	if out, code := step(2, blocks[1]); code != 0 {
		t.Fatalf("step 2 exited %d:\n%s", code, out)
	}
	src, err := cp.Kube.CoreV1().Secrets(ns).Get(ctx, "ray-token", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(src.Data["auth_token"])
	canonical := hex.EncodeToString(sum[:8])
	if len(src.Data["auth_token"]) != 64 {
		t.Fatalf("step 2 wrote a token of %d characters, want 64 hex characters and no newline", len(src.Data["auth_token"]))
	}
	redact = strings.NewReplacer(string(src.Data["auth_token"]), "<token>", canonical, "<its digest>").Replace
	if _, err := cp.Kube.CoreV1().Secrets(ns).Create(ctx, pull, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t1 := time.Now()
	install := strings.TrimRight(blocks[2], "\n") + " \\\n  --set 'imagePullSecrets[0].name=regcred'\n"
	if out, code := step(3, install); code != 0 {
		t.Fatalf("step 3 (helm install oci://…) exited %d:\n%s\nevents:\n%s", code, out, events(ctx, cp.Kube, ns))
	}
	// Step 4 on a running fleet: both replicas roll out; status exits 1 saying the RayService is not adopted.
	if out, code := step(4, blocks[3]); code != 1 || !strings.Contains(out, "successfully rolled out") || !strings.Contains(out, "not adopted") {
		t.Errorf("step 4 exited %d, want 1 with the rollout done and the running RayService not adopted:\n%s", code, redact(out))
	}
	t.Logf("MEASURE quick start: helm install oci://%s/charts/raysync --version %s → rolled out and status answered in %s", registry, version, time.Since(t1).Round(time.Millisecond))
	if now := fleetCluster(ctx, t, cp, "ml-team", "fleet"); now != fleet {
		t.Fatalf("installing moved the running RayService: its cluster %s became %s", fleet, now)
	}
	if out, code := step(5, blocks[4]); code != 0 || !strings.Contains(out, "(dry run: nothing changed)") {
		t.Errorf("step 5 exited %d, want a dry run then the adoption:\n%s", code, redact(out))
	}
	// Adopted, the RayService is replaced onto the canonical token; then step 6 shows its Secret's
	// digest equal to the canonical token's.
	moved := waitRayServiceServing(ctx, t, cp, "ml-team", "fleet", fleet)
	// Its Secret and the canonical token: one digest, the canonical token's, on two lines.
	if shown, code := step(6, blocks[5]); code != 0 || strings.Count(shown, canonical) != 2 || !strings.Contains(shown, moved) {
		t.Errorf("step 6 exited %d: want the adopted RayService's new cluster %s with the canonical token's digest, and that digest:\n%s", code, moved, redact(shown))
	}
	if err := waitReady(ctx, cp, ns, 2); err != nil {
		t.Fatalf("raysync not 2/2 Ready: %v\nevents:\n%s", err, events(ctx, cp.Kube, ns))
	}
	pods, err := cp.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=raysync"})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		st := p.Status.ContainerStatuses
		if p.Spec.Containers[0].Image != registry+"/raysync:"+version || len(st) == 0 || !strings.HasPrefix(st[0].ImageID, registry+"/raysync@sha256:") {
			t.Errorf("pod %s runs %s (%v), want %s/raysync:%s pulled from the registry", p.Name, p.Spec.Containers[0].Image, st, registry, version)
		}
	}
	v, err = exec.CommandContext(ctx, kubectl, "--kubeconfig", cp.Kubeconfig, "-n", ns, "exec", "deploy/raysync", "--", "/syncer", "version").CombinedOutput()
	if err != nil || !strings.HasPrefix(string(v), "syncer "+version+" (commit ") || !strings.Contains(string(v), "linux/amd64") {
		t.Errorf("/syncer version in the pod: %v: %q", err, v)
	}
	t.Logf("in the pod: %s", strings.TrimSpace(string(v)))
}

// registry is a client of the node's registry as any OCI client: TLS from the cluster CA, basic auth.
type registry struct {
	c          *http.Client
	user, pass string
}

func registryClient(t *testing.T, ca string, dockerConfig []byte) *registry {
	t.Helper()
	pem, err := os.ReadFile(ca)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	var cfg struct {
		Auths map[string]struct{ Username, Password string }
	}
	if err := json.Unmarshal(dockerConfig, &cfg); err != nil {
		t.Fatal(err)
	}
	a := cfg.Auths[framework.RegistryPush]
	return &registry{c: &http.Client{Timeout: time.Minute, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}},
		user: a.Username, pass: a.Password}
}

func (r *registry) get(t *testing.T, path, accept string) []byte {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, "https://"+framework.RegistryPush+"/v2/"+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	req.SetBasicAuth(r.user, r.pass)
	resp, err := r.c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /v2/%s: %s %v\n%.500s", path, resp.Status, err, b)
	}
	return b
}

func (r *registry) getJSON(t *testing.T, path, accept string, v any) {
	t.Helper()
	if err := json.Unmarshal(r.get(t, path, accept), v); err != nil {
		t.Fatalf("GET /v2/%s: %v", path, err)
	}
}

// layerFiles are the regular files of a gzipped layer tar, by name.
func layerFiles(t *testing.T, blob []byte) map[string][]byte {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(blob))
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files[h.Name] = b
	}
}

func keys[V any](m map[string]V) string {
	var k []string
	for n := range m {
		k = append(k, n)
	}
	sort.Strings(k)
	return fmt.Sprint(k)
}

// runningFleet is what a cluster runs before raysync comes: in ns, a token-auth RayService of the
// private image with the registry's pull secret of its own (KubeRay's random token), serving. It
// returns its cluster.
func runningFleet(ctx context.Context, t *testing.T, cp *framework.ControlPlane, ns, image string) string {
	t.Helper()
	if _, err := cp.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitServiceAccount(ctx, t, cp.Kube, ns)
	pull, err := cp.RegistryPullSecret(ns, "regcred")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cp.Kube.CoreV1().Secrets(ns).Create(ctx, pull, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cp.Kube.CoreV1().ConfigMaps(ns).Create(ctx, serveAppConfigMap(t, ns), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rs := rayService(ns, "fleet", image, "blue")
	cluster := rs.Object["spec"].(map[string]any)["rayClusterConfig"].(map[string]any)
	for _, g := range []map[string]any{cluster["headGroupSpec"].(map[string]any), cluster["workerGroupSpecs"].([]any)[0].(map[string]any)} {
		g["template"].(map[string]any)["spec"].(map[string]any)["imagePullSecrets"] = []any{map[string]any{"name": "regcred"}}
	}
	if _, err := cp.Dynamic.Resource(rayServiceGVR).Namespace(ns).Create(ctx, rs, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return waitRayServiceServing(ctx, t, cp, ns, "fleet", "")
}

// fleetCluster is the RayService's active cluster now.
func fleetCluster(ctx context.Context, t *testing.T, cp *framework.ControlPlane, ns, name string) string {
	t.Helper()
	u, err := cp.Dynamic.Resource(rayServiceGVR).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	active, _, _ := unstructured.NestedString(u.Object, "status", "activeServiceStatus", "rayClusterName")
	return active
}
