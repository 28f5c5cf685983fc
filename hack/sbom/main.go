// Command sbom writes an SPDX 2.3 SBOM (JSON) of a release: for each
// binary given, the Go modules built into it, as its build information
// records them (debug/buildinfo), with their versions and sums. Pure
// reading: what the binaries say they hold, nothing fetched.
//
//	go run ./hack/sbom -name agentbox-1.2.3 -version 1.2.3 BIN...
package main

import (
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

type pkg struct {
	ID       string     `json:"SPDXID"`
	Name     string     `json:"name"`
	Version  string     `json:"versionInfo,omitempty"`
	Download string     `json:"downloadLocation"`
	Files    bool       `json:"filesAnalyzed"`
	Checks   []checksum `json:"checksums,omitempty"`
	Refs     []ref      `json:"externalRefs,omitempty"`
	Comment  string     `json:"comment,omitempty"`
}

type checksum struct {
	Algorithm string `json:"algorithm"`
	Value     string `json:"checksumValue"`
}

type ref struct {
	Category string `json:"referenceCategory"`
	Type     string `json:"referenceType"`
	Locator  string `json:"referenceLocator"`
}

type relationship struct {
	From string `json:"spdxElementId"`
	Type string `json:"relationshipType"`
	To   string `json:"relatedSpdxElement"`
}

type document struct {
	Version       string         `json:"spdxVersion"`
	License       string         `json:"dataLicense"`
	ID            string         `json:"SPDXID"`
	Name          string         `json:"name"`
	Namespace     string         `json:"documentNamespace"`
	Creation      creation       `json:"creationInfo"`
	Packages      []pkg          `json:"packages"`
	Relationships []relationship `json:"relationships"`
}

type creation struct {
	Created  string   `json:"created"`
	Creators []string `json:"creators"`
}

// spdxID makes an SPDX element id of s: letters, digits, '.' and '-'.
func spdxID(s string) string {
	return "SPDXRef-" + strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '-' {
			return r
		}
		return '-'
	}, s)
}

// build is the SBOM of bins, named name, of release version, made at t.
func build(name, version string, bins []string, t time.Time, comments map[string]string) (*document, error) {
	doc := &document{Version: "SPDX-2.3", License: "CC0-1.0", ID: "SPDXRef-DOCUMENT", Name: name,
		Namespace: "https://agentbox.dev/spdx/" + name,
		Creation:  creation{Created: t.UTC().Format(time.RFC3339), Creators: []string{"Tool: agentbox-hack-sbom"}}}
	seen := map[string]bool{}
	for _, bin := range bins {
		info, err := buildinfo.ReadFile(bin)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", bin, err)
		}
		sum, err := fileSum(bin)
		if err != nil {
			return nil, err
		}
		base := filepath.Base(bin)
		binID := spdxID("bin-" + base)
		doc.Packages = append(doc.Packages, pkg{ID: binID, Name: base, Version: version, Download: "NOASSERTION",
			Checks: []checksum{{"SHA256", sum}}, Comment: strings.TrimSpace("built with " + info.GoVersion + " from " + info.Path + ". " + comments[base])})
		doc.Relationships = append(doc.Relationships, relationship{"SPDXRef-DOCUMENT", "DESCRIBES", binID})
		mods := append([]*debugModule{{info.Main.Path, info.Main.Version, info.Main.Sum}}, nil...)
		for _, d := range info.Deps {
			if d.Replace != nil {
				d = d.Replace
			}
			mods = append(mods, &debugModule{d.Path, d.Version, d.Sum})
		}
		sort.Slice(mods[1:], func(i, j int) bool { return mods[i+1].path < mods[j+1].path })
		for _, m := range mods {
			id := spdxID("go-" + m.path + "-" + m.version)
			if !seen[id] {
				seen[id] = true
				p := pkg{ID: id, Name: m.path, Version: m.version, Download: "NOASSERTION",
					Refs: []ref{{"PACKAGE-MANAGER", "purl", "pkg:golang/" + m.path + "@" + m.version}}}
				if m.sum != "" {
					p.Comment = "go.sum " + m.sum
				}
				doc.Packages = append(doc.Packages, p)
			}
			doc.Relationships = append(doc.Relationships, relationship{binID, "CONTAINS", id})
		}
	}
	return doc, nil
}

type debugModule struct{ path, version, sum string }

func fileSum(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func main() {
	name := flag.String("name", "", "the document's name (agentbox-VERSION)")
	version := flag.String("version", "", "the release's version")
	comment := flag.String("comment", "", "BIN=TEXT: a note on one binary (runsc's patches)")
	flag.Parse()
	if *name == "" || *version == "" || flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: sbom -name NAME -version VERSION [-comment BIN=TEXT] BIN...")
		os.Exit(2)
	}
	comments := map[string]string{}
	if b, text, ok := strings.Cut(*comment, "="); ok {
		comments[b] = text
	}
	// SOURCE_DATE_EPOCH: a release's SBOM is as reproducible as its files.
	t := time.Now()
	if e := os.Getenv("SOURCE_DATE_EPOCH"); e != "" {
		var sec int64
		if _, err := fmt.Sscan(e, &sec); err == nil {
			t = time.Unix(sec, 0)
		}
	}
	doc, err := build(*name, *version, flag.Args(), t, comments)
	if err != nil {
		fmt.Fprintln(os.Stderr, "sbom:", err)
		os.Exit(1)
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(doc); err != nil {
		fmt.Fprintln(os.Stderr, "sbom:", err)
		os.Exit(1)
	}
}
