// Command websrv stands in for critest's nginx and httpd images (no
// registry with the real ones is reachable): it serves a page on $PORT
// (default 80), writes its pid to $PIDFILE if set, and says its own name
// on stdout and stderr, which is what the specs check.
package main

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
)

func main() {
	name := filepath.Base(os.Args[0])
	port := os.Getenv("PORT")
	if port == "" {
		port = "80"
	}
	if pf := os.Getenv("PIDFILE"); pf != "" {
		if err := os.MkdirAll(filepath.Dir(pf), 0o755); err == nil {
			os.WriteFile(pf, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644)
		}
	}
	fmt.Fprintf(os.Stdout, "%s: started\n", name)
	fmt.Fprintf(os.Stderr, "%s: listening on :%s\n", name, port)
	http.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, "<html><body><h1>Welcome to %s!</h1></body></html>\n", name)
	})
	if err := http.ListenAndServe(":"+port, nil); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(1)
	}
}
