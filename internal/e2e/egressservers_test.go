//go:build e2e

package e2e

// The test servers egress tests reach from inside gVisor: counting
// servers, a sink, and the bridge address they listen on.

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// countingServer answers every connection and counts them by the local
// address they reached.
type countingServer struct {
	ln      net.Listener
	port    int
	mu      sync.Mutex
	hits    map[string]int
	accepts []time.Time
}

func serve(addr, reply string) (*countingServer, error) {
	network := "tcp4"
	if strings.HasPrefix(addr, "[") {
		network = "tcp6"
	}
	ln, err := net.Listen(network, addr)
	if err != nil {
		return nil, err
	}
	s := &countingServer{ln: ln, port: ln.Addr().(*net.TCPAddr).Port, hits: map[string]int{}}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			local, _, _ := net.SplitHostPort(c.LocalAddr().String())
			s.mu.Lock()
			s.hits[local]++
			s.accepts = append(s.accepts, time.Now())
			s.mu.Unlock()
			c.Write([]byte(reply))
			c.Close()
		}
	}()
	return s, nil
}

func (s *countingServer) count(addr string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.hits[addr]
}

// egress holds the test servers every destination of the egress tests
// resolves to: all on this machine, on the private containerd's bridge.
var egress struct {
	gateway, other string
	metadata       string
	gateway6       string          // the bridge's IPv6 address
	metadata6      string          // fd00:ec2::254, bound on the bridge
	denied6        *countingServer // [gateway6]:port, allowed by no rule
	meta6          *countingServer // [fd00:ec2::254]:80
	allowed        *countingServer // gateway:port allowed by e2e-allow (listens everywhere)
	denied         *countingServer // another port, same address
	meta           *countingServer // 169.254.169.254:80, bound on the bridge
	sink           *sinkServer     // gateway:port allowed by e2e-allow, for throughput
	upstream       *dnsServer      // the resolvers' upstream, on loopback
	otherDNS       *dnsServer      // another resolver, on other:53, that pods must not reach
}

// sinkServer reads each connection to the end and records its bytes and
// the time from its first byte to its end.
type sinkServer struct {
	port int
	mu   sync.Mutex
	runs []sinkRun
}

type sinkRun struct {
	bytes int64
	took  time.Duration
}

func newSink() (*sinkServer, error) {
	ln, err := net.Listen("tcp4", "0.0.0.0:0")
	if err != nil {
		return nil, err
	}
	s := &sinkServer{port: ln.Addr().(*net.TCPAddr).Port}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 256<<10)
				var n int64
				var first time.Time
				for {
					k, err := c.Read(buf)
					if k > 0 && first.IsZero() {
						first = time.Now()
					}
					n += int64(k)
					if err != nil {
						break
					}
				}
				s.mu.Lock()
				s.runs = append(s.runs, sinkRun{n, time.Since(first)})
				s.mu.Unlock()
			}()
		}
	}()
	return s, nil
}

func startEgressServers(d *daemon) error {
	gw, bridge, err := bridgeOf(d)
	if err != nil {
		return err
	}
	egress.gateway = gw
	egress.other = strings.TrimSuffix(gw, ".1") + ".254"
	egress.metadata = "169.254.169.254"
	egress.gateway6 = "fd00:ab:" + strings.Split(gw, ".")[2] + "::1"
	egress.metadata6 = "fd00:ec2::254"
	// The "other" and metadata addresses live on the private bridge only,
	// which hack/containerd.sh stop deletes.
	for _, a := range []string{egress.other + "/32", egress.metadata + "/32", egress.metadata6 + "/128"} {
		if out, err := exec.Command("ip", "addr", "add", a, "dev", bridge, "nodad").CombinedOutput(); err != nil {
			return fmt.Errorf("ip addr add %s dev %s: %v: %s", a, bridge, err, out)
		}
	}
	if egress.allowed, err = serve("0.0.0.0:0", "allowed-server\n"); err != nil {
		return err
	}
	if egress.denied, err = serve("0.0.0.0:0", "denied-server\n"); err != nil {
		return err
	}
	if egress.meta, err = serve(egress.metadata+":80", "metadata-server\n"); err != nil {
		return err
	}
	if egress.denied6, err = serve("["+egress.gateway6+"]:0", "v6-server\n"); err != nil {
		return err
	}
	if egress.meta6, err = serve("["+egress.metadata6+"]:80", "metadata-server\n"); err != nil {
		return err
	}
	if egress.sink, err = newSink(); err != nil {
		return err
	}
	if err := startWebHost(); err != nil {
		return err
	}
	return startDNSServers(d)
}

// bridgeOf reads the gateway address and bridge name from the daemon's CNI
// config.
func bridgeOf(d *daemon) (gw, bridge string, err error) {
	b, err := os.ReadFile(filepath.Join(d.dir, "cni", "net.d", "10-agentbox.conflist"))
	if err != nil {
		return "", "", err
	}
	var conf struct {
		Plugins []struct {
			Bridge string `json:"bridge"`
			IPAM   struct {
				Ranges [][]struct{ Subnet string } `json:"ranges"`
			} `json:"ipam"`
		} `json:"plugins"`
	}
	if err := json.Unmarshal(b, &conf); err != nil {
		return "", "", err
	}
	_, n, err := net.ParseCIDR(conf.Plugins[0].IPAM.Ranges[0][0].Subnet)
	if err != nil {
		return "", "", err
	}
	ip := n.IP.To4()
	ip[3]++
	return ip.String(), conf.Plugins[0].Bridge, nil
}

func probeScript(targets ...string) string {
	var b strings.Builder
	for _, t := range targets {
		host, port, _ := net.SplitHostPort(t)
		fmt.Fprintf(&b, "r=$(nc -w 3 %s %s </dev/null 2>&1); echo \"probe %s: $r\"; ", host, port, t)
	}
	b.WriteString("echo probes-done; sleep 600")
	return b.String()
}

func sortedPorts(a, b int) []int {
	if a > b {
		a, b = b, a
	}
	return []int{a, b}
}

func (s *countingServer) snapshot() []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Time(nil), s.accepts...)
}

func (s *sinkServer) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.runs)
}

// run waits (up to 10s) for the n-th run to end and returns it.
func (s *sinkServer) run(n int) sinkRun {
	for i := 0; i < 200; i++ {
		s.mu.Lock()
		if len(s.runs) > n {
			r := s.runs[n]
			s.mu.Unlock()
			return r
		}
		s.mu.Unlock()
		time.Sleep(50 * time.Millisecond)
	}
	return sinkRun{}
}
