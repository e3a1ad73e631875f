package framework

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// The Ray image: Debian bookworm from debootstrap (minbase) with Python 3.11 and Ray from the
// hash-pinned e2e/ray/requirements.txt, user ray (1000:100, HOME /home/ray) as in Ray's own images,
// assembled as one layer with go-containerregistry (e2e/tools/image rootfs) and pushed to the real
// node's registry as a private image.

// RayImageRepoTag is the Ray image's repository and tag in the node's registry.
const RayImageRepoTag = "ray/ray:" + RayVersion

// rayImageConfig is the image's run configuration (part of the cache key).
var rayImageConfig = []string{"-user", "1000:100", "-workdir", "/home/ray",
	"-env", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin,HOME=/home/ray,LANG=C.UTF-8", "-cmd", "/bin/bash"}

// RayImageBuild says what EnsureRayImage did.
type RayImageBuild struct {
	Tar string
	// Built is false when the image came from the cache; the durations are zero then.
	Built                 bool
	Wheels, RootFS, Layer time.Duration
	RootFSBytes, TarBytes int64
}

// EnsureRayImage builds the Ray image into <cache>/ray-image-<key>.tar unless it is there and returns
// it. The key hashes the build's inputs (the lock file, the rootfs script, the image tool and the
// image's configuration), so a change to any of them rebuilds it. One build at a time per cache
// (a lock of its own: the build takes minutes and must not hold up the other builds).
func EnsureRayImage(ctx context.Context, logf func(string, ...any)) (*RayImageBuild, error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("the Ray image's build needs root (debootstrap, chroot)")
	}
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	cache, err := CacheDir()
	if err != nil {
		return nil, err
	}
	requirements := filepath.Join(root, "e2e/ray/requirements.txt")
	script := filepath.Join(root, "e2e/ray/image/build-rootfs.sh")
	h := sha256.New()
	for _, f := range []string{requirements, script} {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		h.Write(b)
	}
	fmt.Fprintf(h, "%s %s", ImageToolName, strings.Join(rayImageConfig, " "))
	key := hex.EncodeToString(h.Sum(nil))[:12]
	b := &RayImageBuild{Tar: filepath.Join(cache, "ray-image-"+key+".tar")}
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return nil, err
	}
	unlock, err := lockFile(filepath.Join(cache, "ray-image.lock"))
	if err != nil {
		return nil, err
	}
	defer unlock()
	if st, err := os.Stat(b.Tar); err == nil {
		b.TarBytes = st.Size()
		return b, nil
	}
	tool, err := EnsureImageTool(ctx, logf)
	if err != nil {
		return nil, err
	}
	python, err := python311(ctx)
	if err != nil {
		return nil, err
	}
	work := filepath.Join(cache, "ray-image-work")
	if err := os.RemoveAll(work); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(work, 0o755); err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)
	logf("building the Ray %s image (first run only; several minutes: debootstrap, Ray's wheels)", RayVersion)
	b.Built = true
	run := func(d *time.Duration, name string, args ...string) error {
		t0 := time.Now()
		cmd := exec.CommandContext(ctx, name, args...)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("Ray image: %s: %v\n%s", strings.Join(append([]string{name}, args...), " "), err, lastLines(out.String(), 30))
		}
		*d = time.Since(t0)
		return nil
	}
	wheels, rootfs, layer := filepath.Join(work, "wheels"), filepath.Join(work, "rootfs"), filepath.Join(work, "layer.tar.gz")
	if err := run(&b.Wheels, python, "-m", "pip", "download", "--no-deps", "--require-hashes", "--only-binary=:all:", "--no-cache-dir",
		"--disable-pip-version-check", "-q", "-d", wheels, "-r", requirements); err != nil {
		return nil, err
	}
	if err := run(&b.RootFS, script, rootfs, wheels, requirements); err != nil {
		return nil, err
	}
	if b.RootFSBytes, err = dirBytes(rootfs); err != nil {
		return nil, err
	}
	var tarTime time.Duration
	if err := run(&tarTime, "tar", "-C", rootfs, "--numeric-owner", "-czf", layer, "."); err != nil {
		return nil, err
	}
	args := append([]string{"rootfs", "-layer", layer, "-ref", RegistryHost + "/" + RayImageRepoTag, "-out", b.Tar + ".tmp"}, rayImageConfig...)
	if err := run(&b.Layer, tool, args...); err != nil {
		return nil, err
	}
	b.Layer += tarTime
	st, err := os.Stat(b.Tar + ".tmp")
	if err != nil {
		return nil, err
	}
	b.TarBytes = st.Size()
	logf("built the Ray image: wheels %s, rootfs %s (%d MiB), layer and image %s (%d MiB compressed)",
		b.Wheels.Round(time.Second), b.RootFS.Round(time.Second), b.RootFSBytes>>20, b.Layer.Round(time.Second), b.TarBytes>>20)
	return b, os.Rename(b.Tar+".tmp", b.Tar)
}

// dirBytes is the size of the regular files below dir.
func dirBytes(dir string) (int64, error) {
	var n int64
	err := filepath.WalkDir(dir, func(_ string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			info, err := d.Info()
			if err != nil {
				return err
			}
			n += info.Size()
		}
		return nil
	})
	return n, err
}

// PushRayImage builds the Ray image if needed and pushes it to the node's registry (under the
// registry's account); it returns the reference the node pulls it by.
func (c *ControlPlane) PushRayImage(ctx context.Context, logf func(string, ...any)) (string, error) {
	b, err := EnsureRayImage(ctx, logf)
	if err != nil {
		return "", err
	}
	return c.PushImage(ctx, b.Tar, RayImageRepoTag)
}
