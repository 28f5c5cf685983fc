package policy

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

func TestMaskPaths(t *testing.T) {
	image := map[string]PathKind{"etc/passwd": PathFile, "usr/local/bin": PathDir, "bin/busybox": PathFile}
	binds := map[string]PathKind{"/staged/0/secret.txt": PathFile}
	env := MountEnv{
		MaskFile: "/bundle/agentbox-masked",
		Kind: func(root, rel string) (PathKind, string, error) {
			if root == "" {
				switch rel {
				case "etc/broken":
					return 0, "", errors.New("layer /l: permission denied")
				case "etc/mtab": // -> /proc/self/mounts, gVisor's
					return 0, "/proc/self/mounts", nil
				case "bin/ls": // -> /bin/busybox, in the image
					return 0, "/bin/busybox", nil
				case "etc/data": // -> /data/secret.txt, on a bind
					return 0, "/data/secret.txt", nil
				case "loop":
					return 0, "/loop", nil
				}
				return image[rel], "", nil
			}
			return binds[root+"/"+rel], "", nil
		},
	}
	tmpfs := func(p string) specs.Mount {
		return specs.Mount{Destination: p, Type: "tmpfs", Source: "tmpfs", Options: []string{"ro", "nosuid", "nodev", "noexec", "mode=0555"}}
	}
	file := func(p string) specs.Mount {
		return specs.Mount{Destination: p, Type: "bind", Source: "/bundle/agentbox-masked", Options: []string{"rbind", "ro", "nosuid", "nodev", "noexec"}}
	}
	base := []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc"},
		{Destination: "/data", Type: "bind", Source: "/staged/0", Options: []string{"rbind"}},
		{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs"},
	}
	for _, c := range []struct {
		name    string
		masked  []string
		want    []specs.Mount // appended after base
		msg     string
		wantErr string
	}{
		{"CRI defaults: gVisor has only /sys/firmware", []string{"/proc/kcore", "/proc/keys", "/sys/firmware", "/proc/sysrq-trigger"},
			[]specs.Mount{tmpfs("/sys/firmware"), file("/proc/sysrq-trigger")}, "absent at start, not masked: [/proc/kcore /proc/keys]", ""},
		{"image file and directory", []string{"/etc/passwd", "/usr/local/bin"}, []specs.Mount{file("/etc/passwd"), tmpfs("/usr/local/bin")}, "masked [/etc/passwd (file) /usr/local/bin (dir)]", ""},
		{"under a bind, by its source", []string{"/data/secret.txt", "/data/nothing"}, []specs.Mount{file("/data/secret.txt")}, "not masked: [/data/nothing]", ""},
		{"a bind's own destination", []string{"/data"}, nil, "not masked: [/data]", ""},
		{"under a fresh tmpfs: empty at start", []string{"/tmp/x"}, nil, "not masked: [/tmp/x]", ""},
		{"symlinks followed inside the container", []string{"/bin/ls", "/etc/data"},
			[]specs.Mount{file("/bin/ls"), file("/etc/data")}, "masked [/bin/ls (file) /etc/data (file)]", ""},
		{"a symlink into gVisor's /proc", []string{"/etc/mtab"}, nil, "", "masked path /etc/mtab: /proc/self/mounts is in gVisor's own /proc or /sys, where agentbox can mask only"},
		{"a gVisor path the table does not know", []string{"/proc/cpuinfo"}, nil, "", "masked path /proc/cpuinfo: /proc/cpuinfo is in gVisor's own"},
		{"a symlink loop", []string{"/loop"}, nil, "", "masked path /loop: too many levels of symlinks"},
		{"an unreadable layer", []string{"/etc/broken"}, nil, "", "masked path /etc/broken: layer /l: permission denied"},
		{"not clean", []string{"/etc/../etc/passwd"}, nil, "", "linux.maskedPaths[0]"},
		{"the root", []string{"/"}, nil, "", "linux.maskedPaths[0]"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := &specs.Spec{Mounts: append([]specs.Mount(nil), base...), Linux: &specs.Linux{MaskedPaths: c.masked}}
			msg, err := maskPaths(s, env)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("error %v, want %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := s.Mounts[len(base):]; !reflect.DeepEqual(got, c.want) && (len(got) != 0 || len(c.want) != 0) {
				t.Errorf("mounts added:\n got %+v\nwant %+v", got, c.want)
			}
			if s.Linux.MaskedPaths != nil {
				t.Errorf("maskedPaths left for runsc to ignore: %v", s.Linux.MaskedPaths)
			}
			if !strings.Contains(msg, c.msg) {
				t.Errorf("message %q lacks %q", msg, c.msg)
			}
		})
	}
	// Without a Kind (policy explain) the paths stay listed.
	s := &specs.Spec{Linux: &specs.Linux{MaskedPaths: []string{"/etc/passwd"}}}
	if _, err := maskPaths(s, MountEnv{}); err != nil || len(s.Linux.MaskedPaths) != 1 || len(s.Mounts) != 0 {
		t.Errorf("explain: %v %+v", err, s)
	}
}

func TestReadonlyPaths(t *testing.T) {
	mounts := []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc"},
		{Destination: "/models", Type: "bind", Source: "/staged/1", Options: []string{"rbind", "ro"}},
		{Destination: "/workspace", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid"}},
	}
	for _, c := range []struct {
		name     string
		rootRO   bool
		paths    []string
		msg, err string
	}{
		{"the CRI's, in gVisor's /proc", false, []string{"/proc/bus", "/proc/sys", "/proc/sysrq-trigger"}, "gVisor's own; writes stay in the sandbox): [/proc/bus /proc/sys /proc/sysrq-trigger]", ""},
		{"in the read-only image", true, []string{"/etc"}, "already read-only: [/etc (read-only root)]", ""},
		{"under a read-only bind", false, []string{"/models/x"}, "/models/x (read-only mount /models)", ""},
		{"in a writable image", false, []string{"/etc"}, "", "linux.readonlyPaths[0]: /etc is in a writable root filesystem"},
		{"in writable scratch", true, []string{"/proc/sys", "/workspace/keep"}, "", "linux.readonlyPaths[1]: /workspace/keep is in the writable mount /workspace"},
		{"not clean", true, []string{"proc/sys"}, "", "linux.readonlyPaths[0]"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := &specs.Spec{Root: &specs.Root{Readonly: c.rootRO}, Mounts: mounts, Linux: &specs.Linux{ReadonlyPaths: c.paths}}
			msg, err := readonlyPaths(s)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("error %v, want %q", err, c.err)
				}
				return
			}
			if err != nil || !strings.Contains(msg, c.msg) || s.Linux.ReadonlyPaths != nil {
				t.Errorf("%q, %v, left %v; want %q", msg, err, s.Linux.ReadonlyPaths, c.msg)
			}
		})
	}
}
