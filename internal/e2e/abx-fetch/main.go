// abx-fetch is the e2e suite's HTTPS client inside the sandbox: a static
// program in the probe image that verifies the server as any client does
// (the system roots, or SSL_CERT_FILE; the test's CA from $AGENT_CA_PEM),
// with the knobs an attacker would turn: another Host, another SNI, and the
// address to connect to (like curl --resolve).
//
//	abx-fetch [-X METHOD] [-H 'Name: value']... [-host H] [-sni S] [-connect HOST:PORT] [-n N] [-progress D] URL
//	abx-fetch -ws MESSAGE ws://HOST/PATH
//
// It prints "status=N body=..." or "error: ...". With -ws it opens the URL
// as a WebSocket, sends MESSAGE and prints "ws: REPLY". With -n it makes N
// requests one after another, each on a new connection, and prints their
// latency (p50, p90, p99) and the bytes and seconds in all (benchmarks).
// With -progress it reads the whole body and prints "progress MS BYTES"
// every D (MS: Unix milliseconds) and "progress-end MS BYTES ERR" when
// the body ends: a download cut off shows when its bytes stopped (-stall:
// give up when nothing arrives for that long).
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/net/websocket"
)

func main() {
	host := flag.String("host", "", "the Host header (default: the URL's)")
	sni := flag.String("sni", "", "the TLS server name (default: the URL's host)")
	connect := flag.String("connect", "", "connect here instead of the URL's host and port")
	n := flag.Int("n", 0, "make n requests and print their latency")
	method := flag.String("X", "GET", "the request method")
	progress := flag.Duration("progress", 0, "read the whole body, printing the bytes received this often")
	stall := flag.Duration("stall", 0, "with -progress: give up when nothing arrives for this long")
	var headers [][2]string
	flag.Func("H", "a request header, 'Name: value' (repeatable)", func(v string) error {
		k, val, ok := strings.Cut(v, ":")
		if !ok {
			return fmt.Errorf("%q is not 'Name: value'", v)
		}
		headers = append(headers, [2]string{strings.TrimSpace(k), strings.TrimSpace(val)})
		return nil
	})
	ws := flag.String("ws", "", "open the URL as a WebSocket, send this message and print the reply")
	flag.Parse()
	if flag.NArg() == 1 && *ws != "" {
		os.Exit(webSocket(flag.Arg(0), *ws))
	}
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
	if *progress > 0 {
		c.Timeout = 0
	}
	resp, err := c.Do(req)
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	defer resp.Body.Close()
	if *progress > 0 {
		os.Exit(follow(resp.Body, *progress, *stall))
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	fmt.Printf("status=%d body=%s\n", resp.StatusCode, strings.TrimSpace(string(b)))
}

// webSocket sends msg on a WebSocket to url and prints the reply.
func webSocket(url, msg string) int {
	cfg, err := websocket.NewConfig(url, "http://agent.invalid")
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	ws, err := websocket.DialConfig(cfg)
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	defer ws.Close()
	ws.SetDeadline(time.Now().Add(8 * time.Second))
	var reply string
	err = websocket.Message.Send(ws, msg)
	if err == nil {
		err = websocket.Message.Receive(ws, &reply)
	}
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	fmt.Println("ws:", reply)
	return 0
}

// follow reads body to its end, printing how much arrived every tick; it
// gives up when nothing arrived for stall (0: never).
func follow(body io.Reader, tick, stall time.Duration) int {
	var n atomic.Int64
	done := make(chan error, 1)
	go func() {
		buf := make([]byte, 32<<10)
		for {
			k, err := body.Read(buf)
			n.Add(int64(k))
			if err != nil {
				done <- err
				return
			}
		}
	}()
	t := time.NewTicker(tick)
	defer t.Stop()
	last, grew := int64(0), time.Now()
	for {
		select {
		case err := <-done:
			fmt.Printf("progress-end %d %d %v\n", time.Now().UnixMilli(), n.Load(), err)
			if errors.Is(err, io.EOF) {
				return 0
			}
			return 1
		case <-t.C:
			k := n.Load()
			fmt.Printf("progress %d %d\n", time.Now().UnixMilli(), k)
			if k > last {
				last, grew = k, time.Now()
			} else if stall > 0 && time.Since(grew) > stall {
				fmt.Printf("progress-end %d %d stalled for %v\n", time.Now().UnixMilli(), k, stall)
				return 1
			}
		}
	}
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
