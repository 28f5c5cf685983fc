//go:build ignore

// Command runsc-precompile writes runsc's precompiled seccomp programs into
// a gVisor source tree, as gVisor's own (Bazel) build does and `go build`
// of the Go module does not: without them, every sandbox and every gofer
// compiles its seccomp filter from scratch at start ("No precompiled
// program found ... This slows down sandbox startup"), some 20 ms of CPU a
// pod. The programs are gVisor's own (runsc's filter configs'
// PrecompiledPrograms); a program is chosen at run time by the exact key
// of the options it was compiled for, and a sandbox whose options have
// none compiles its filter as before.
//
// Run from the root of the (patched) gVisor tree, before building runsc:
//
//	go run runsc-precompile.go
//
// The Sentry's programs for GPU, TPU and RDMA proxies and for host
// networking are left out (agentbox runs none of them; each would add
// megabytes of source for nothing).
package main

import (
	"fmt"
	"os"
	"strings"

	"gvisor.dev/gvisor/pkg/seccomp/precompiledseccomp"
	bootconfig "gvisor.dev/gvisor/runsc/boot/filter/config"
	goferconfig "gvisor.dev/gvisor/runsc/fsgofer/filter/config"
)

func main() {
	boot, err := bootconfig.PrecompiledPrograms()
	if err != nil {
		fail(err)
	}
	var kept []precompiledseccomp.Program
	for _, p := range boot {
		if strings.Contains(p.Name, "HostNetwork=false") && strings.Contains(p.Name, "NVProxy=false") &&
			strings.Contains(p.Name, "TPUProxy=false") && strings.Contains(p.Name, "RDMAProxy=false") {
			kept = append(kept, p)
		}
	}
	gofer, err := goferconfig.PrecompiledPrograms()
	if err != nil {
		fail(err)
	}
	write("runsc/boot/filter/filter_precompiled.go", kept)
	write("runsc/fsgofer/filter/filter_precompiled.go", gofer)
	fmt.Printf("precompiled seccomp programs: %d of %d for the sandbox, %d for the gofer\n", len(kept), len(boot), len(gofer))
}

// write registers progs in the package's filter_precompiled.go at path,
// whose registerPrograms gVisor's module leaves empty.
func write(path string, progs []precompiledseccomp.Program) {
	b, err := os.ReadFile(path)
	if err != nil {
		fail(err)
	}
	src := string(b)
	const disabled, register = "PrecompilationDisabledAtBuildTime = true", "\tprecompiledPrograms = programs\n"
	if strings.Count(src, disabled) != 1 || strings.Count(src, register) != 1 || len(progs) == 0 {
		fail(fmt.Errorf("%s: not the file this generator knows (gVisor changed it?), or no programs", path))
	}
	var reg strings.Builder
	for _, p := range progs {
		reg.WriteString(p.Registration("\t", "precompiledseccomp", "programs"))
	}
	src = strings.Replace(src, disabled, "PrecompilationDisabledAtBuildTime = false", 1)
	src = strings.Replace(src, register, reg.String()+register, 1)
	if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "runsc-precompile:", err)
	os.Exit(1)
}
