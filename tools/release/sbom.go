package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"runtime/debug"
	"sort"
	"time"
)

// CycloneDX 1.5 JSON (cyclonedx.org/docs/1.5/json): the fields a scanner reads.
type bom struct {
	BOMFormat    string       `json:"bomFormat"`
	SpecVersion  string       `json:"specVersion"`
	SerialNumber string       `json:"serialNumber"`
	Version      int          `json:"version"`
	Metadata     bomMetadata  `json:"metadata"`
	Components   []component  `json:"components"`
	Dependencies []dependency `json:"dependencies"`
}

type bomMetadata struct {
	Timestamp string    `json:"timestamp"`
	Tools     bomTools  `json:"tools"`
	Component component `json:"component"`
}

type bomTools struct {
	Components []component `json:"components"`
}

type component struct {
	Type       string     `json:"type"`
	BOMRef     string     `json:"bom-ref,omitempty"`
	Name       string     `json:"name"`
	Version    string     `json:"version,omitempty"`
	PURL       string     `json:"purl,omitempty"`
	Hashes     []hash     `json:"hashes,omitempty"`
	Properties []property `json:"properties,omitempty"`
}

type hash struct {
	Alg     string `json:"alg"`
	Content string `json:"content"`
}

type property struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

type dependency struct {
	Ref       string   `json:"ref"`
	DependsOn []string `json:"dependsOn"`
}

func goPURL(path, version string) string {
	return "pkg:golang/" + path + "@" + version + "?type=module"
}

// sbomFor lists what the build info of one binary says was linked into it: every module (after
// replace directives) at its version, and the Go standard library of the toolchain. binSHA256 is the
// binary's digest, which also derives the document's serial number (same binary, same document).
func sbomFor(info *debug.BuildInfo, version, platform string, binSHA256 []byte, created time.Time) ([]byte, error) {
	root := component{Type: "application", BOMRef: goPURL(info.Main.Path, "v"+version), Name: "syncer", Version: version,
		PURL: goPURL(info.Main.Path, "v"+version), Hashes: []hash{{Alg: "SHA-256", Content: hex.EncodeToString(binSHA256)}},
		Properties: []property{{"raysync:platform", platform}, {"raysync:go", info.GoVersion}}}
	for _, s := range info.Settings {
		if s.Key == "vcs.revision" || s.Key == "-ldflags" || s.Key == "CGO_ENABLED" {
			root.Properties = append(root.Properties, property{"go:build:" + s.Key, s.Value})
		}
	}
	comps := []component{{Type: "library", BOMRef: "pkg:golang/stdlib@" + info.GoVersion, Name: "stdlib", Version: info.GoVersion,
		PURL: "pkg:golang/stdlib@" + info.GoVersion}}
	for _, d := range info.Deps {
		m := d
		if d.Replace != nil {
			m = d.Replace
		}
		c := component{Type: "library", BOMRef: goPURL(m.Path, m.Version), Name: m.Path, Version: m.Version, PURL: goPURL(m.Path, m.Version)}
		if m.Sum != "" {
			c.Properties = append(c.Properties, property{"go:sum", m.Sum})
		}
		if d.Replace != nil {
			c.Properties = append(c.Properties, property{"go:replaces", d.Path + "@" + d.Version})
		}
		comps = append(comps, c)
	}
	sort.Slice(comps, func(i, j int) bool { return comps[i].BOMRef < comps[j].BOMRef })
	dep := dependency{Ref: root.BOMRef}
	for _, c := range comps {
		dep.DependsOn = append(dep.DependsOn, c.BOMRef)
	}
	doc := bom{BOMFormat: "CycloneDX", SpecVersion: "1.5", Version: 1,
		SerialNumber: uuidFrom(binSHA256),
		Metadata: bomMetadata{Timestamp: created.UTC().Format(time.RFC3339), Component: root,
			Tools: bomTools{Components: []component{{Type: "application", Name: "raysync tools/release"}}}},
		Components: comps, Dependencies: []dependency{dep}}
	return json.MarshalIndent(doc, "", "  ")
}

// uuidFrom makes a UUID (version 5 layout, RFC 4122 variant) out of a digest's first 16 bytes.
func uuidFrom(digest []byte) string {
	b := append([]byte(nil), digest[:16]...)
	b[6] = b[6]&0x0f | 0x50
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("urn:uuid:%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// sha256Of is a file's SHA-256.
func sha256Of(b []byte) []byte {
	s := sha256.Sum256(b)
	return s[:]
}
