// Command image assembles and inspects raysync's container image without a Docker engine, using
// go-containerregistry. It mirrors the final stage of the repository's Dockerfile on an empty base:
//
//	image build -binary bin/syncer -out raysync.tar   # one layer with /syncer, numeric non-root user, entrypoint
//	image inspect raysync.tar                         # JSON: user, entrypoint, files of every layer
package main

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
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
	case "inspect":
		fail(inspect(os.Args[2]))
	default:
		fail(fmt.Errorf("unknown command %q", os.Args[1]))
	}
}

func build(bin, out string) error {
	b, err := os.ReadFile(bin)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Name: "syncer", Mode: 0o555, Size: int64(len(b)), Uid: 0, Gid: 0, Typeflag: tar.TypeReg}); err != nil {
		return err
	}
	if _, err := tw.Write(b); err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	layer, err := tarball.LayerFromReader(bytes.NewReader(buf.Bytes()))
	if err != nil {
		return err
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
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
