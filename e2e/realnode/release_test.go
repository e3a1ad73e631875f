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

	"github.com/raysync/raysync/e2e/framework"
)

// TestRealNodeRelease cuts a release as docs/contributing/releasing.md says, into the node's registry
// (REGISTRY given with a trailing slash, as people paste it): the image index holds exactly linux/amd64
// and linux/arm64, each an ELF /syncer of its architecture; the darwin binaries are Mach-O of theirs;
// SHA256SUMS matches; the SBOM names the modules at go.mod's versions; `syncer version` prints the
// version. Then `helm install oci://…/charts/raysync --version` with only the required values (and the
// registry's pull secret) pulls the amd64 image by the chart's default repository and runs Ready.
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

	// Install from the registry with the chart's defaults: the image repository is the released one.
	ns := "raysync"
	if _, err := cp.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitServiceAccount(ctx, t, cp.Kube, ns)
	if _, err := cp.Kube.CoreV1().Secrets(ns).Create(ctx, pull, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cp.Kube.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "ray-token"},
		StringData: map[string]string{"auth_token": "realnode-release-token"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t1 := time.Now()
	chart := "oci://" + registry + "/charts/raysync"
	if out, err := cp.Helm(ctx, t.Logf, "install", "raysync", chart, "--version", version, "--namespace", ns, "--ca-file", ca,
		"--set", "authSource.namespace=raysync,authSource.name=ray-token,allNamespaces=true,imagePullSecrets[0].name=regcred"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if err := waitReady(ctx, cp, ns, 2); err != nil {
		t.Fatalf("helm install %s --version %s: raysync not 2/2 Ready: %v\nevents:\n%s", chart, version, err, events(ctx, cp.Kube, ns))
	}
	t.Logf("MEASURE helm install %s --version %s → 2/2 Ready in %s", chart, version, time.Since(t1).Round(time.Millisecond))
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
	kubectl, err := framework.Kubectl(ctx, t.Logf)
	if err != nil {
		t.Fatal(err)
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
