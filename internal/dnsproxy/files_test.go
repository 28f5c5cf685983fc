package dnsproxy

import (
	"net/netip"
	"strings"
	"testing"
)

func TestResolvConf(t *testing.T) {
	got := string(ResolvConf([]byte("search ns.svc.cluster.local svc.cluster.local\nnameserver 10.96.0.10\noptions ndots:5\n#x\n"), netip.MustParseAddr("169.254.53.53")))
	want := "# agentbox: names resolve through the pod's resolver, which answers only what its role allows.\nnameserver 169.254.53.53\nsearch ns.svc.cluster.local svc.cluster.local\noptions ndots:5\n"
	if got != want {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}
}

func TestHosts(t *testing.T) {
	gw := netip.MustParseAddr("169.254.53.53")
	kube := "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n10.0.0.7\tcoder-1\n# Entries added by HostAliases.\n192.0.2.9\tpypi.org"
	block := "# agentbox: the role's host rules, reached through the pod's egress gateway\n"
	for _, tc := range []struct {
		name     string
		original string
		names    []string
		want     string
	}{
		{"the pod's file first, exact names after, once each", kube, []string{"pypi.org", "*.github.com", "API.github.com.", "api.github.com", "files.pythonhosted.org"},
			kube + "\n" + block + "169.254.53.53\tpypi.org\n169.254.53.53\tapi.github.com\n169.254.53.53\tfiles.pythonhosted.org\n"},
		{"no file: localhost", "", []string{"example.com"},
			"127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n" + block + "169.254.53.53\texample.com\n"},
		{"patterns, addresses and odd names stay with the resolver", "127.0.0.1 localhost\n", []string{"*.example.com", "192.0.2.1", "a..b", "bad name", "x\ny", strings.Repeat("a", 64) + ".com"},
			"127.0.0.1 localhost\n"},
	} {
		if got := string(Hosts([]byte(tc.original), gw, tc.names)); got != tc.want {
			t.Errorf("%s: got:\n%s\nwant:\n%s", tc.name, got, tc.want)
		}
	}
}
