// Command nnp stands in for critest's nonewprivs image: installed setuid
// root, it prints the effective uid, which no_new_privs keeps unchanged.
package main

import (
	"fmt"
	"os"
)

func main() { fmt.Printf("Effective uid: %d\n", os.Geteuid()) }
