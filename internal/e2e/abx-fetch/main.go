// abx-fetch is the e2e suite's HTTPS client inside the sandbox: a static
// program in the probe image that verifies the server as any client does
// (the system roots, or SSL_CERT_FILE; the test's CA from $AGENT_CA_PEM),
// with the knobs an attacker would turn: another Host, another SNI, and the
// address to connect to (like curl --resolve).
//
//	abx-fetch [-X METHOD] [-H 'Name: value']... [-host H] [-sni S] [-connect HOST:PORT] [-n N] URL
//
// It prints "status=N body=..." or "error: ...". With -n it makes N
// requests one after another, each on a new connection, and prints their
// latency (p50, p90, p99) and the bytes and seconds in all (benchmarks).
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sort"
	"strings"
	"time"
)

func main() {
	host := flag.String("host", "", "the Host header (default: the URL's)")
	sni := flag.String("sni", "", "the TLS server name (default: the URL's host)")
	connect := flag.String("connect", "", "connect here instead of the URL's host and port")
	n := flag.Int("n", 0, "make n requests and print their latency")
	method := flag.String("X", "GET", "the request method")
	var headers [][2]string
	flag.Func("H", "a request header, 'Name: value' (repeatable)", func(v string) error {
		k, val, ok := strings.Cut(v, ":")
		if !ok {
			return fmt.Errorf("%q is not 'Name: value'", v)
		}
		headers = append(headers, [2]string{strings.TrimSpace(k), strings.TrimSpace(val)})
		return nil
	})
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: abx-fetch [-host H] [-sni S] [-connect HOST:PORT] URL")
		os.Exit(2)
	}
	roots, err := x509.SystemCertPool()
	if err != nil || roots == nil {
		roots = x509.NewCertPool()
	}
	if pem := os.Getenv("AGENT_CA_PEM"); pem != "" {
		roots.AppendCertsFromPEM([]byte(pem))
	}
	tr := &http.Transport{
		TLSClientConfig:   &tls.Config{RootCAs: roots, ServerName: *sni},
		DisableKeepAlives: true,
		Proxy:             nil,
	}
	if *connect != "" {
		tr.DialContext = func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, *connect)
		}
	}
	req, err := http.NewRequest(*method, flag.Arg(0), nil)
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	for _, h := range headers {
		req.Header.Add(h[0], h[1])
	}
	if *host != "" {
		req.Host = *host
	}
	c := &http.Client{Transport: tr, Timeout: 8 * time.Second}
	if *n > 0 {
		c.Timeout = 5 * time.Minute
		repeat(c, req, *n)
		return
	}
	resp, err := c.Do(req)
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	fmt.Printf("status=%d body=%s\n", resp.StatusCode, strings.TrimSpace(string(b)))
}

// repeat makes n requests and prints their latency and volume.
func repeat(c *http.Client, req *http.Request, n int) {
	var took []time.Duration
	var total int64
	start := time.Now()
	for i := 0; i < n; i++ {
		t0 := time.Now()
		resp, err := c.Do(req)
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		k, _ := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			fmt.Println("error: status", resp.StatusCode)
			os.Exit(1)
		}
		total += k
		took = append(took, time.Since(t0))
	}
	secs := time.Since(start).Seconds()
	sort.Slice(took, func(i, j int) bool { return took[i] < took[j] })
	q := func(f float64) float64 { return float64(took[int(f*float64(len(took)-1))].Microseconds()) / 1000 }
	fmt.Printf("n=%d p50=%.2fms p90=%.2fms p99=%.2fms bytes=%d secs=%.3f\n", n, q(0.5), q(0.9), q(0.99), total, secs)
}
