// Package forward sends a trail's records, as written, to where a SIEM
// reads them: a webhook (JSON lines or OTLP/HTTP logs), spooled on the
// node while the endpoint is down so that none is lost.
package forward

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// WebhookConfig configures the network sink.
type WebhookConfig struct {
	URL           string
	SpoolDir      string
	MaxSpoolBytes int64
	BatchRecords  int
	// Format is "ndjson" (default) or "otlp" (OTLP/HTTP JSON logs).
	Format string
	// Client is the HTTP client (default: 10s timeout).
	Client *http.Client
}

// Backoff bounds between failed deliveries.
var (
	MinBackoff = 100 * time.Millisecond
	MaxBackoff = 10 * time.Second
)

// Webhook ships a sandbox's committed records to an HTTP endpoint as
// application/x-ndjson POSTs of up to BatchRecords lines. Every record is
// first appended to a spool file on disk; a sender delivers the spool in
// order, retrying with exponential backoff while the endpoint is down, and
// remembers how far it got in an offset file. Nothing is lost across an
// outage, nor across a shim restart: a later shim resumes spools nobody
// holds (ResumeSpools). A record that does not fit in the spool is lost,
// and the trail records the loss.
type Webhook struct {
	cfg        WebhookConfig
	spool      *os.File
	spoolPath  string
	offsetPath string

	mu      sync.Mutex
	size    int64 // bytes in the spool
	closing bool
	wake    chan struct{}
	done    chan struct{}
	// Delivered counts records the endpoint accepted.
	delivered uint64
}

// NewWebhook starts the sink for one sandbox.
func NewWebhook(cfg WebhookConfig, sandbox string) (*Webhook, error) {
	if err := os.MkdirAll(cfg.SpoolDir, 0o750); err != nil {
		return nil, err
	}
	path := filepath.Join(cfg.SpoolDir, sandbox+".spool")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o640)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("spool %s is held by another shim: %w", path, err)
	}
	return startWebhook(cfg, f, path), nil
}

func startWebhook(cfg WebhookConfig, f *os.File, path string) *Webhook {
	if cfg.Client == nil {
		cfg.Client = &http.Client{Timeout: 10 * time.Second}
	}
	if cfg.BatchRecords <= 0 {
		cfg.BatchRecords = 512
	}
	st, _ := f.Stat()
	w := &Webhook{cfg: cfg, spool: f, spoolPath: path, offsetPath: strings.TrimSuffix(path, ".spool") + ".offset",
		wake: make(chan struct{}, 1), done: make(chan struct{})}
	if st != nil {
		w.size = st.Size()
	}
	go w.send()
	return w
}

// ResumeSpools delivers spools left by shims that are gone, in the
// background. It returns how many it took over.
func ResumeSpools(cfg WebhookConfig) int {
	matches, _ := filepath.Glob(filepath.Join(cfg.SpoolDir, "*.spool"))
	n := 0
	for _, m := range matches {
		f, err := os.OpenFile(m, os.O_RDWR|os.O_APPEND, 0)
		if err != nil {
			continue
		}
		if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil {
			f.Close() // a live shim holds it
			continue
		}
		w := startWebhook(cfg, f, m)
		w.Close()
		n++
	}
	return n
}

// Forward implements Forwarder: it appends to the spool.
func (w *Webhook) Forward(lines []byte, n int) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closing {
		return errors.New("webhook sink closed")
	}
	if w.size+int64(len(lines)) > w.cfg.MaxSpoolBytes {
		return fmt.Errorf("webhook spool full (%d bytes): endpoint %s unreachable too long", w.cfg.MaxSpoolBytes, w.cfg.URL)
	}
	if _, err := w.spool.Write(lines); err != nil {
		return fmt.Errorf("webhook spool: %w", err)
	}
	w.size += int64(len(lines))
	select {
	case w.wake <- struct{}{}:
	default:
	}
	return nil
}

// Close stops taking records; the sender goes on until the spool is
// delivered (then removes it) while this process lives.
func (w *Webhook) Close() error {
	w.mu.Lock()
	w.closing = true
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
	return nil
}

// Wait blocks until the spool is delivered and removed, or ctx ends.
func (w *Webhook) Wait(ctx context.Context) error {
	select {
	case <-w.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Delivered is how many records the endpoint accepted.
func (w *Webhook) Delivered() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.delivered
}

func (w *Webhook) readOffset() int64 {
	b, err := os.ReadFile(w.offsetPath)
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n
}

func (w *Webhook) writeOffset(n int64) error {
	tmp := w.offsetPath + ".tmp"
	if err := os.WriteFile(tmp, []byte(strconv.FormatInt(n, 10)), 0o640); err != nil {
		return err
	}
	return os.Rename(tmp, w.offsetPath)
}

func (w *Webhook) send() {
	defer close(w.done)
	off := w.readOffset()
	backoff := MinBackoff
	for {
		w.mu.Lock()
		size, closing := w.size, w.closing
		w.mu.Unlock()
		if off >= size {
			if closing {
				w.spool.Close()
				os.Remove(w.spoolPath)
				os.Remove(w.offsetPath)
				return
			}
			<-w.wake
			continue
		}
		batch, n, err := w.readBatch(off)
		if err == nil && n > 0 {
			err = w.post(batch)
		}
		if err != nil {
			time.Sleep(backoff)
			if backoff *= 2; backoff > MaxBackoff {
				backoff = MaxBackoff
			}
			continue
		}
		backoff = MinBackoff
		off += int64(len(batch))
		w.writeOffset(off)
		w.mu.Lock()
		w.delivered += uint64(n)
		w.mu.Unlock()
	}
}

// readBatch reads whole lines from the spool at off.
func (w *Webhook) readBatch(off int64) ([]byte, int, error) {
	r := bufio.NewReader(io.NewSectionReader(w.spool, off, 1<<62))
	var buf bytes.Buffer
	n := 0
	for n < w.cfg.BatchRecords {
		line, err := r.ReadBytes('\n')
		if err != nil {
			break // a partial last line waits for the rest
		}
		buf.Write(line)
		n++
	}
	return buf.Bytes(), n, nil
}

func (w *Webhook) post(body []byte) error {
	contentType := "application/x-ndjson"
	if w.cfg.Format == "otlp" {
		body, contentType = OTLPLogs(body), "application/json"
	}
	req, err := http.NewRequest(http.MethodPost, w.cfg.URL, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", contentType)
	resp, err := w.cfg.Client.Do(req)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("webhook %s: %s", w.cfg.URL, resp.Status)
	}
	return nil
}
