// abx-fetch is the e2e suite's HTTPS client inside the sandbox: a static
// program in the probe image that verifies the server as any client does
// (the system roots, or SSL_CERT_FILE; the test's CA from $AGENT_CA_PEM),
// with the knobs an attacker would turn: another Host, another SNI, and the
// address to connect to (like curl --resolve).
//
//	abx-fetch [-host H] [-sni S] [-connect HOST:PORT] URL
//
// It prints "status=N body=..." or "error: ...".
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
	"strings"
	"time"
)

func main() {
	host := flag.String("host", "", "the Host header (default: the URL's)")
	sni := flag.String("sni", "", "the TLS server name (default: the URL's host)")
	connect := flag.String("connect", "", "connect here instead of the URL's host and port")
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
	req, err := http.NewRequest("GET", flag.Arg(0), nil)
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	if *host != "" {
		req.Host = *host
	}
	c := &http.Client{Transport: tr, Timeout: 8 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	fmt.Printf("status=%d body=%s\n", resp.StatusCode, strings.TrimSpace(string(b)))
}
