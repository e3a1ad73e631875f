// Command image assembles and inspects raysync's container image without a Docker engine, using
// go-containerregistry. It mirrors the final stage of the repository's Dockerfile on an empty base:
//
//	image build -binary bin/syncer -out raysync.tar   # one layer with /syncer, numeric non-root user, entrypoint
//	image inspect raysync.tar                         # JSON: user, entrypoint, files of every layer
//	image single -binary F -entrypoint /pause -ref R -out T  # the real node's one-binary images
//	image rootfs -layer L.tar.gz -ref R -out T -user U -workdir D -env K=V,...  # a root filesystem as one layer
//	image push -tar T -ref R -ca CA -auth FILE               # push to the real node's registry (FILE: user:password)
//	image htpasswd -auth FILE                                # the registry's htpasswd line (bcrypt) for FILE
//	image index -ref R -binary linux/amd64=F ... -label K=V ... -created EPOCH [-ca CA]  # make release's image
package main

import (
	"archive/tar"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// User and entrypoint, as in the Dockerfile.
const (
	user       = "65532:65532"
	entrypoint = "/syncer"
)

func main() {
	if len(os.Args) < 2 {
		fail(fmt.Errorf("usage: image build -binary FILE -out TAR | image inspect TAR"))
	}
	switch os.Args[1] {
	case "build":
		fs := flag.NewFlagSet("build", flag.ExitOnError)
		bin := fs.String("binary", "", "static syncer binary")
		out := fs.String("out", "", "image tarball to write")
		_ = fs.Parse(os.Args[2:])
		fail(build(*bin, *out))
	case "single":
		fs := flag.NewFlagSet("single", flag.ExitOnError)
		bin := fs.String("binary", "", "static binary, the image's only file")
		ep := fs.String("entrypoint", "", "absolute path of the binary in the image")
		ref := fs.String("ref", "", "image reference recorded in the tarball")
		out := fs.String("out", "", "image tarball to write")
		_ = fs.Parse(os.Args[2:])
		fail(single(*bin, *ep, *ref, *out))
	case "rootfs":
		fs := flag.NewFlagSet("rootfs", flag.ExitOnError)
		layer := fs.String("layer", "", "the root filesystem as a tar (gzip or plain)")
		ref := fs.String("ref", "", "image reference recorded in the tarball")
		out := fs.String("out", "", "image tarball to write")
		u := fs.String("user", "", "user the image runs as (uid:gid)")
		wd := fs.String("workdir", "/", "working directory")
		env := fs.String("env", "", "comma-separated K=V")
		cmd := fs.String("cmd", "", "comma-separated default command")
		_ = fs.Parse(os.Args[2:])
		fail(rootfs(*layer, *ref, *out, v1.Config{User: *u, WorkingDir: *wd, Env: split(*env), Cmd: split(*cmd)}))
	case "push":
		fs := flag.NewFlagSet("push", flag.ExitOnError)
		tar := fs.String("tar", "", "image tarball")
		ref := fs.String("ref", "", "where to push")
		ca := fs.String("ca", "", "CA of the registry's certificate")
		auth := fs.String("auth", "", "file holding user:password")
		_ = fs.Parse(os.Args[2:])
		fail(push(*tar, *ref, *ca, *auth))
	case "htpasswd":
		fs := flag.NewFlagSet("htpasswd", flag.ExitOnError)
		auth := fs.String("auth", "", "file holding user:password")
		_ = fs.Parse(os.Args[2:])
		fail(htpasswd(*auth))
	case "index":
		fs := flag.NewFlagSet("index", flag.ExitOnError)
		var bins, labels multiFlag
		ref := fs.String("ref", "", "where to push the index (REGISTRY/raysync:VERSION)")
		fs.Var(&bins, "binary", "OS/ARCH=FILE: the static syncer for that platform (repeat per platform)")
		fs.Var(&labels, "label", "KEY=VALUE: a label of every platform's config and an annotation of the index (repeat)")
		created := fs.Int64("created", 0, "seconds since 1970: the images' creation time and their file's time (SOURCE_DATE_EPOCH)")
		ca := fs.String("ca", "", "extra CA for the registry's certificate (besides the system's)")
		plainHTTP := fs.Bool("plain-http", false, "talk HTTP, not HTTPS, to the registry")
		_ = fs.Parse(os.Args[2:])
		fail(index(*ref, bins, labels, time.Unix(*created, 0).UTC(), *ca, *plainHTTP))
	case "inspect":
		fail(inspect(os.Args[2]))
	default:
		fail(fmt.Errorf("unknown command %q", os.Args[1]))
	}
}

func build(bin, out string) error {
	img, err := binaryImage(bin, "syncer")
	if err != nil {
		return err
	}
	img, err = mutate.Config(img, v1.Config{User: user, Entrypoint: []string{entrypoint}, WorkingDir: "/"})
	if err != nil {
		return err
	}
	ref, err := name.ParseReference("ghcr.io/raysync/syncer:dev")
	if err != nil {
		return err
	}
	return tarball.WriteToFile(out, ref, img)
}

// single writes a one-layer linux/amd64 image holding one static binary as its entrypoint, run as
// root (the pause image and the e2e tests' tiny workload).
func single(bin, entrypoint, ref, out string) error {
	img, err := binaryImage(bin, entrypoint[1:])
	if err != nil {
		return err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config = v1.Config{Entrypoint: []string{entrypoint}, WorkingDir: "/"}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return err
	}
	r, err := name.ParseReference(ref)
	if err != nil {
		return err
	}
	return tarball.WriteToFile(out, r, img)
}

// rootfs writes a linux/amd64 image of one layer, a whole root filesystem (the Ray image: Debian from
// debootstrap with Ray installed), with the given run configuration.
func rootfs(layerPath, ref, out string, cfg v1.Config) error {
	layer, err := tarball.LayerFromFile(layerPath)
	if err != nil {
		return err
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config = cfg
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return err
	}
	r, err := name.ParseReference(ref)
	if err != nil {
		return err
	}
	return tarball.WriteToFile(out, r, img)
}

func split(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

// binaryImage is an image of one layer on an empty base: the static binary bin at /path, mode 0555,
// owned by root.
func binaryImage(bin, path string) (v1.Image, error) {
	layer, err := binaryLayer(bin, path, time.Time{})
	if err != nil {
		return nil, err
	}
	return mutate.AppendLayers(empty.Image, layer)
}

// index pushes an OCI image index with one image per platform, each the Dockerfile's final stage on
// an empty base: the binary at /syncer (mode 0555, time created), user 65532:65532, entrypoint /syncer.
// Credentials come from the Docker config ($DOCKER_CONFIG, ~/.docker/config.json, its helpers), as
// for docker, crane and helm. Same inputs, same digest: every time in it is created.
func index(ref string, bins, labels multiFlag, created time.Time, ca string, plainHTTP bool) error {
	var opts []name.Option
	if plainHTTP {
		opts = append(opts, name.Insecure)
	}
	r, err := name.NewTag(ref, opts...)
	if err != nil {
		return err
	}
	if len(bins) == 0 {
		return fmt.Errorf("no -binary")
	}
	lbl := map[string]string{}
	for _, l := range labels {
		k, v, ok := strings.Cut(l, "=")
		if !ok {
			return fmt.Errorf("-label %q: want KEY=VALUE", l)
		}
		lbl[k] = v
	}
	var idx v1.ImageIndex = mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, b := range bins {
		platform, file, ok := strings.Cut(b, "=")
		osName, arch, ok2 := strings.Cut(platform, "/")
		if !ok || !ok2 {
			return fmt.Errorf("-binary %q: want OS/ARCH=FILE", b)
		}
		layer, err := binaryLayer(file, strings.TrimPrefix(entrypoint, "/"), created, tarball.WithMediaType(types.OCILayer))
		if err != nil {
			return err
		}
		img, err := mutate.AppendLayers(mutate.MediaType(mutate.ConfigMediaType(empty.Image, types.OCIConfigJSON), types.OCIManifestSchema1), layer)
		if err != nil {
			return err
		}
		cf, err := img.ConfigFile()
		if err != nil {
			return err
		}
		cf = cf.DeepCopy()
		cf.OS, cf.Architecture, cf.Created = osName, arch, v1.Time{Time: created}
		cf.Config = v1.Config{User: user, Entrypoint: []string{entrypoint}, WorkingDir: "/", Labels: lbl}
		cf.History = []v1.History{{Created: v1.Time{Time: created}, CreatedBy: "make release: COPY syncer /syncer"}}
		if img, err = mutate.ConfigFile(img, cf); err != nil {
			return err
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{
			MediaType: types.OCIManifestSchema1, Platform: &v1.Platform{OS: osName, Architecture: arch}}})
	}
	idx = mutate.Annotations(idx, lbl).(v1.ImageIndex)
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if ca != "" {
		pem, err := os.ReadFile(ca)
		if err != nil {
			return err
		}
		pool, err := x509.SystemCertPool()
		if err != nil {
			pool = x509.NewCertPool()
		}
		if !pool.AppendCertsFromPEM(pem) {
			return fmt.Errorf("no certificate in %s", ca)
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool}
	}
	if err := remote.WriteIndex(r, idx, remote.WithAuthFromKeychain(authn.DefaultKeychain), remote.WithTransport(tr)); err != nil {
		return err
	}
	d, err := idx.Digest()
	if err != nil {
		return err
	}
	fmt.Printf("%s@%s\n", r.Context().Name(), d)
	return nil
}

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

// binaryLayer is one layer holding the binary bin at path, mode 0555, owned by root, dated modTime.
func binaryLayer(bin, path string, modTime time.Time, opts ...tarball.LayerOption) (v1.Layer, error) {
	b, err := os.ReadFile(bin)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Name: path, Mode: 0o555, Size: int64(len(b)), Typeflag: tar.TypeReg, ModTime: modTime}); err != nil {
		return nil, err
	}
	if _, err := tw.Write(b); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	data := buf.Bytes() // in memory: LayerFromReader would leave a copy in $TMPDIR for every build
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil }, opts...)
}

func readAuth(path string) (user, password string, err error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", "", err
	}
	u, p, ok := strings.Cut(strings.TrimSpace(string(b)), ":")
	if !ok {
		return "", "", fmt.Errorf("%s: want user:password", path)
	}
	return u, p, nil
}

// push uploads an image tarball with basic auth over TLS verified against ca (never the system pool).
func push(tarPath, ref, ca, authFile string) error {
	img, err := tarball.ImageFromPath(tarPath, nil)
	if err != nil {
		return err
	}
	r, err := name.ParseReference(ref)
	if err != nil {
		return err
	}
	u, p, err := readAuth(authFile)
	if err != nil {
		return err
	}
	pem, err := os.ReadFile(ca)
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return fmt.Errorf("no certificate in %s", ca)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: pool}
	tr.Proxy = nil
	return remote.Write(r, img, remote.WithAuth(&authn.Basic{Username: u, Password: p}), remote.WithTransport(tr))
}

func htpasswd(authFile string) error {
	u, p, err := readAuth(authFile)
	if err != nil {
		return err
	}
	h, err := bcrypt.GenerateFromPassword([]byte(p), bcrypt.DefaultCost)
	if err != nil {
		return err
	}
	fmt.Printf("%s:%s\n", u, h)
	return nil
}

type report struct {
	User       string   `json:"user"`
	Entrypoint []string `json:"entrypoint"`
	Cmd        []string `json:"cmd"`
	Layers     int      `json:"layers"`
	Files      []file   `json:"files"`
}

type file struct {
	Name string `json:"name"`
	Mode int64  `json:"mode"`
	Size int64  `json:"size"`
}

func inspect(path string) error {
	img, err := tarball.ImageFromPath(path, nil)
	if err != nil {
		return err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return err
	}
	layers, err := img.Layers()
	if err != nil {
		return err
	}
	r := report{User: cfg.Config.User, Entrypoint: cfg.Config.Entrypoint, Cmd: cfg.Config.Cmd, Layers: len(layers)}
	for _, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			return err
		}
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				return err
			}
			r.Files = append(r.Files, file{Name: h.Name, Mode: h.Mode, Size: h.Size})
		}
		rc.Close()
	}
	return json.NewEncoder(os.Stdout).Encode(r)
}

func fail(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}
