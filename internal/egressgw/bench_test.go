package egressgw

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"syscall"
	"testing"
	"time"
)

// benchmarkDownload fetches a download of size bytes through the gateway
// for sni, on one kept connection: the gateway's cost per byte, spliced
// (passthrough) or terminated (inspected: its own TLS toward the client,
// the site's toward it).
func benchmarkDownload(b *testing.B, sni string, size int64) {
	f, ca := inspectFixture(b)
	roots := f.pool.Clone()
	roots.AddCert(ca.Certificate())
	client := &http.Client{Transport: &http.Transport{
		DialTLSContext: func(_ context.Context, _, _ string) (net.Conn, error) {
			c, err := net.Dial("tcp4", fmt.Sprintf("127.0.0.1:%d", f.port))
			if err != nil {
				return nil, err
			}
			return tls.Client(c, &tls.Config{ServerName: sni, RootCAs: roots}), nil
		},
	}}
	defer client.CloseIdleConnections()
	url := fmt.Sprintf("https://%s:%d/api/bytes/%d", sni, f.port, size)
	b.SetBytes(size)
	before := cpuTime()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		resp, err := client.Get(url)
		if err != nil {
			b.Fatal(err)
		}
		n, err := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil || n != size {
			b.Fatalf("read %d of %d: %v", n, size, err)
		}
	}
	b.StopTimer()
	// CPU time of the whole process (the site, the gateway and the
	// client): steadier than time on a shared machine.
	b.ReportMetric(float64(cpuTime()-before)/float64(b.N)/1e6, "cpu-ms/op")
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func BenchmarkInspectedDownload(b *testing.B)   { benchmarkDownload(b, "a.test", 64<<20) }
func BenchmarkPassthroughDownload(b *testing.B) { benchmarkDownload(b, "other.test", 64<<20) }

// BenchmarkScannedDownload: inspected, toward the host a secret is
// injected for, so the response is scanned for the secret as it streams.
func BenchmarkScannedDownload(b *testing.B) { benchmarkDownload(b, "b.test", 64<<20) }
