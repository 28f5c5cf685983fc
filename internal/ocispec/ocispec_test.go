package ocispec

import (
	"fmt"
	"math/rand"
	"reflect"
	"regexp"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

func intp(i int) *int { return &i }

func TestMarkSandboxRoot(t *testing.T) {
	cases := []struct {
		name        string
		annotations map[string]string
		want        map[string]string
		changed     bool
	}{
		{"plain ctr", nil, map[string]string{ContainerTypeAnnotation: "sandbox"}, true},
		{"other annotations kept", map[string]string{"a": "b"}, map[string]string{"a": "b", ContainerTypeAnnotation: "sandbox"}, true},
		{"CRI sandbox", map[string]string{ContainerTypeAnnotation: "sandbox"}, map[string]string{ContainerTypeAnnotation: "sandbox"}, false},
		{"CRI container", map[string]string{ContainerTypeAnnotation: "container", SandboxIDAnnotation: "p"}, map[string]string{ContainerTypeAnnotation: "container", SandboxIDAnnotation: "p"}, false},
		{"CRI-O container", map[string]string{CRIOContainerTypeAnnotation: "container"}, map[string]string{CRIOContainerTypeAnnotation: "container"}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := &specs.Spec{Annotations: tc.annotations}
			msg, err := MarkSandboxRoot(s)
			if err != nil {
				t.Fatal(err)
			}
			if (msg != "") != tc.changed {
				t.Fatalf("changed = %q, want %v", msg, tc.changed)
			}
			if !reflect.DeepEqual(s.Annotations, tc.want) {
				t.Fatalf("annotations %v, want %v", s.Annotations, tc.want)
			}
		})
	}
}

func TestRaiseOOMScoreAdj(t *testing.T) {
	cases := []struct {
		name  string
		proc  *specs.Process
		floor int
		want  *int
		// changed says whether the rewrite reports a change.
		changed bool
	}{
		{"CRI sandbox -998 raised to 0", &specs.Process{OOMScoreAdj: intp(-998)}, 0, intp(0), true},
		{"at floor kept", &specs.Process{OOMScoreAdj: intp(0)}, 0, intp(0), false},
		{"above floor kept", &specs.Process{OOMScoreAdj: intp(500)}, 0, intp(500), false},
		{"unset stays unset", &specs.Process{}, 0, nil, false},
		{"no process", nil, 0, nil, false},
		{"host floor not zero", &specs.Process{OOMScoreAdj: intp(-500)}, 100, intp(100), true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := &specs.Spec{Process: tc.proc}
			changes, err := Apply(s, RaiseOOMScoreAdj(tc.floor))
			if err != nil {
				t.Fatal(err)
			}
			var got *int
			if s.Process != nil {
				got = s.Process.OOMScoreAdj
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("oomScoreAdj %v, want %v", deref(got), deref(tc.want))
			}
			if (len(changes) == 1) != tc.changed || len(changes) > 1 {
				t.Fatalf("changes %q, want changed=%v", changes, tc.changed)
			}
		})
	}
}

func deref(p *int) any {
	if p == nil {
		return nil
	}
	return *p
}

func TestIsSandboxContainerOf(t *testing.T) {
	if id, ok := IsSandboxContainerOf(&specs.Spec{Annotations: map[string]string{ContainerTypeAnnotation: "container", SandboxIDAnnotation: "pod1"}}); !ok || id != "pod1" {
		t.Fatalf("CRI container: %q %v", id, ok)
	}
	if _, ok := IsSandboxContainerOf(&specs.Spec{Annotations: map[string]string{ContainerTypeAnnotation: "sandbox"}}); ok {
		t.Fatal("sandbox root reported as joining")
	}
	if _, ok := IsSandboxContainerOf(&specs.Spec{}); ok {
		t.Fatal("plain container reported as joining")
	}
}

func TestMountResolvConf(t *testing.T) {
	cri := &specs.Spec{Mounts: []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc"},
		{Destination: "/etc/resolv.conf", Type: "bind", Source: "/var/lib/cri/sandboxes/x/resolv.conf", Options: []string{"rbind", "rw"}},
	}}
	if ResolvConfSource(cri) != "/var/lib/cri/sandboxes/x/resolv.conf" {
		t.Fatalf("source %q", ResolvConfSource(cri))
	}
	msg, err := MountResolvConf("/b/agentbox-resolv.conf")(cri)
	if err != nil || !strings.Contains(msg, "replaced") || len(cri.Mounts) != 2 {
		t.Fatalf("%s %v %+v", msg, err, cri.Mounts)
	}
	if m := cri.Mounts[1]; m.Source != "/b/agentbox-resolv.conf" || strings.Join(m.Options, ",") != "rbind,ro" {
		t.Errorf("mount %+v", m)
	}
	// Every mount at the destination goes, however it is spelt, and the
	// file is mounted last (over a parent directory's mount).
	hosts := &specs.Spec{Mounts: []specs.Mount{
		{Destination: "/etc/hosts", Type: "bind", Source: "/var/lib/kubelet/pods/u/etc-hosts", Options: []string{"rbind", "rw"}},
		{Destination: "/etc", Type: "bind", Source: "/srv/etc"},
		{Destination: "/etc//hosts/", Type: "bind", Source: "/srv/other-hosts"},
	}}
	if MountSource(hosts, HostsPath) != "/var/lib/kubelet/pods/u/etc-hosts" {
		t.Fatalf("source %q", MountSource(hosts, HostsPath))
	}
	if replaced, err := MountFile(HostsPath, "/b/agentbox-hosts")(hosts); err != nil || replaced != "/var/lib/kubelet/pods/u/etc-hosts" || len(hosts.Mounts) != 2 ||
		hosts.Mounts[0].Destination != "/etc" || hosts.Mounts[1].Source != "/b/agentbox-hosts" || strings.Join(hosts.Mounts[1].Options, ",") != "rbind,ro" {
		t.Errorf("%q %v %+v", replaced, err, hosts.Mounts)
	}
	plain := &specs.Spec{}
	if ResolvConfSource(plain) != "" {
		t.Error("no mount, no source")
	}
	if msg, _ := MountResolvConf("/b/r")(plain); !strings.Contains(msg, "mounted") || len(plain.Mounts) != 1 || plain.Mounts[0].Destination != "/etc/resolv.conf" {
		t.Errorf("%s %+v", msg, plain.Mounts)
	}
}

// TestPlainUIDIsTheExpression: the loop accepts exactly what the regular
// expression it replaced did.
func TestPlainUIDIsTheExpression(t *testing.T) {
	re := regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9-]{0,127}$`)
	alphabet := "azAZ09-._/ \x00\xff"
	r := rand.New(rand.NewSource(1))
	for i := 0; i < 20000; i++ {
		b := make([]byte, r.Intn(131))
		for j := range b {
			b[j] = alphabet[r.Intn(len(alphabet))]
		}
		if i%2 == 0 && len(b) > 0 { // mostly valid, to reach the length bound
			for j := range b {
				b[j] = "azAZ09-"[r.Intn(7)]
			}
			b[0] = 'a'
		}
		if s := string(b); plainUID(s) != re.MatchString(s) {
			t.Fatalf("%q: loop %v, expression %v", s, plainUID(s), re.MatchString(s))
		}
	}
	for uid, ok := range map[string]bool{"": false, "-a": false, "a-": true, strings.Repeat("a", 128): true, strings.Repeat("a", 129): false, "../x": false} {
		if plainUID(uid) != ok {
			t.Errorf("plainUID(%q) = %v, want %v", uid, !ok, ok)
		}
	}
}

func TestRootFromImage(t *testing.T) {
	base := func() *specs.Spec {
		return &specs.Spec{Root: &specs.Root{Path: "rootfs"}, Annotations: map[string]string{ContainerTypeAnnotation: ContainerTypeSandbox}, Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/dev/shm", Type: "bind", Source: "/run/x/shm", Options: []string{"rbind"}},
			{Destination: "/etc/resolv.conf", Type: "bind", Source: "/b/resolv.conf", Options: []string{"rbind", "ro"}},
			{Destination: "/etc/hostname/", Type: "", Source: "/b/hostname", Options: []string{"rbind"}},
		}}
	}
	s := base()
	msg, err := RootFromImage("/run/agentbox/pause/k.erofs")(s)
	if err != nil {
		t.Fatal(err)
	}
	if !s.Root.Readonly || s.Annotations[RootfsSourceAnnotation] != "/run/agentbox/pause/k.erofs" || s.Annotations[RootfsTypeAnnotation] != "erofs" {
		t.Errorf("root %+v, annotations %v", s.Root, s.Annotations)
	}
	var dsts []string
	for _, m := range s.Mounts {
		dsts = append(dsts, m.Destination)
	}
	if strings.Join(dsts, " ") != "/proc /dev/shm" {
		t.Errorf("mounts left %v, want /proc and /dev/shm (gVisor's shim makes it a tmpfs)", dsts)
	}
	if strings.Contains(msg, "gofer still") {
		t.Errorf("message %q: /dev/shm needs no gofer", msg)
	}
	if !strings.Contains(msg, "/etc/resolv.conf, /etc/hostname dropped") {
		t.Errorf("message %q does not name what it dropped", msg)
	}

	s = base()
	s.Mounts = append(s.Mounts, specs.Mount{Destination: "/data", Type: "none", Source: "/srv", Options: []string{"bind"}})
	msg, err = RootFromImage("/i")(s)
	if err != nil || !strings.Contains(msg, "a gofer still serves its host mounts at /data") || len(s.Mounts) != 3 {
		t.Errorf("a bind by option: %q, %v, mounts %v: want it kept and named", msg, err, s.Mounts)
	}

	for name, bad := range map[string]func(*specs.Spec){
		"a root image of its own":  func(s *specs.Spec) { s.Annotations[RootfsTypeAnnotation] = "erofs" },
		"a root source of its own": func(s *specs.Spec) { s.Annotations[RootfsSourceAnnotation] = "/x" },
		"no root":                  func(s *specs.Spec) { s.Root = nil },
	} {
		s := base()
		bad(s)
		before := fmt.Sprint(s.Mounts, s.Annotations, s.Root)
		if _, err := RootFromImage("/i")(s); err == nil {
			t.Errorf("%s: accepted", name)
		} else if fmt.Sprint(s.Mounts, s.Annotations, s.Root) != before {
			t.Errorf("%s: refused (%v) but changed the spec", name, err)
		}
	}
}
