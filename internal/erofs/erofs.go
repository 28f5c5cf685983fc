// Package erofs writes a directory tree as an uncompressed EROFS image, the
// read-only filesystem gVisor's Sentry mounts from a single host file
// without a gofer (gvisor.dev/gvisor/pkg/erofs reads it). It writes only
// what that reader supports: extended inodes, no extended attributes, and
// every file's data in plain blocks (no inline tails), which gVisor needs
// to map an executable.
//
// The package is pure: the caller gives the tree and, for each regular
// file, a reader of its bytes; Write lays the image out first and then
// writes it front to back.
package erofs

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"sort"
	"strings"
	"time"
)

const (
	blockBits  = 12
	blockSize  = 1 << blockBits
	magic      = 0xe0f5e1e2
	sbOffset   = 1024
	inodeSize  = 64 // extended inodes only
	slotBits   = 5
	direntSize = 12
	maxNameLen = 255

	layoutExtended = 1
	dataFlatPlain  = 0
)

// File types in a directory entry.
const (
	ftRegular = 1
	ftDir     = 2
	ftSymlink = 7
)

// Node is one file of the tree. Mode carries the type (regular, directory
// or symlink; Write refuses any other) and the permission bits.
type Node struct {
	Name     string
	Mode     fs.FileMode
	UID, GID uint32
	ModTime  time.Time
	// Size is a regular file's length: Open must yield exactly that many
	// bytes.
	Size int64
	// Target is a symlink's target.
	Target string
	// Children are a directory's entries.
	Children []*Node
	// Open reads a regular file's bytes.
	Open func() (io.ReadCloser, error)

	parent *Node
	nid    uint64
	blkOff uint32 // first data block
	size   uint64 // bytes of data (a directory's, as laid out)
	dir    [][]byte
}

// Limits bound what Write accepts.
type Limits struct {
	// Files bounds the number of nodes.
	Files int
	// Bytes bounds the image's size.
	Bytes int64
}

// Write writes the tree under root (a directory) to w as an EROFS image and
// returns the image's size.
func Write(w io.Writer, root *Node, lim Limits) (int64, error) {
	if !root.Mode.IsDir() {
		return 0, errors.New("erofs: the root is not a directory")
	}
	var nodes []*Node
	if err := collect(root, root, &nodes, lim.Files); err != nil {
		return 0, err
	}
	// Inodes follow the superblock's block; nids count 32-byte slots from
	// the image's start (the metadata area begins at block 0).
	metaEnd := uint64(blockSize) + uint64(len(nodes))*inodeSize
	next := roundUp(metaEnd)
	for i, n := range nodes {
		n.nid = (blockSize + uint64(i)*inodeSize) >> slotBits
	}
	for _, n := range nodes {
		if n.Mode.IsDir() {
			n.dir = dirBlocks(n)
			n.size = uint64(len(n.dir)-1)*blockSize + uint64(len(n.dir[len(n.dir)-1]))
		}
		if n.size == 0 {
			continue
		}
		if next>>blockBits > 1<<32-1 {
			return 0, errors.New("erofs: the image's blocks exceed 32 bits")
		}
		n.blkOff = uint32(next >> blockBits)
		next += roundUp(n.size)
		if lim.Bytes > 0 && next > uint64(lim.Bytes) {
			return 0, fmt.Errorf("erofs: the image would exceed %d bytes", lim.Bytes)
		}
	}
	ew := &errWriter{w: w}
	ew.write(superBlock(root.nid, len(nodes), next))
	for _, n := range nodes {
		ew.write(inode(n))
	}
	ew.pad()
	for _, n := range nodes {
		if err := writeData(ew, n); err != nil {
			return ew.n, err
		}
	}
	return ew.n, ew.err
}

// collect lists the nodes depth first, the root first, checking each.
func collect(n, parent *Node, out *[]*Node, max int) error {
	switch {
	case n.Mode.IsDir(), n.Mode.IsRegular():
	case n.Mode&fs.ModeSymlink != 0:
		if len(n.Target) == 0 || len(n.Target) >= blockSize {
			return fmt.Errorf("erofs: symlink %q: a target of %d bytes", n.Name, len(n.Target))
		}
	default:
		return fmt.Errorf("erofs: %q is a %v: only directories, regular files and symlinks are written", n.Name, n.Mode.Type())
	}
	if n.Mode.IsRegular() {
		if n.Size < 0 {
			return fmt.Errorf("erofs: %q has a negative size", n.Name)
		}
		n.size = uint64(n.Size)
	}
	if n.Mode&fs.ModeSymlink != 0 {
		n.size = uint64(len(n.Target))
	}
	n.parent = parent
	*out = append(*out, n)
	if max > 0 && len(*out) > max {
		return fmt.Errorf("erofs: more than %d files", max)
	}
	seen := map[string]bool{}
	for _, c := range n.Children {
		if c.Name == "" || c.Name == "." || c.Name == ".." || len(c.Name) > maxNameLen || strings.ContainsAny(c.Name, "/\x00") {
			return fmt.Errorf("erofs: an entry of %q is named %q", n.Name, c.Name)
		}
		if seen[c.Name] {
			return fmt.Errorf("erofs: %q has two entries named %q", n.Name, c.Name)
		}
		seen[c.Name] = true
		if err := collect(c, n, out, max); err != nil {
			return err
		}
	}
	return nil
}

func roundUp(n uint64) uint64 { return (n + blockSize - 1) &^ (blockSize - 1) }

// dirBlocks lays out a directory's entries, "." and ".." included, sorted
// by name as EROFS requires, packed into blocks; the last block is cut to
// its used length.
func dirBlocks(n *Node) [][]byte {
	type ent struct {
		name string
		nid  uint64
		ft   uint8
	}
	// The root is its own parent.
	ents := []ent{{".", n.nid, ftDir}, {"..", n.parent.nid, ftDir}}
	for _, c := range n.Children {
		ents = append(ents, ent{c.Name, c.nid, fileType(c.Mode)})
	}
	sort.Slice(ents, func(i, j int) bool { return ents[i].name < ents[j].name })
	var blocks [][]byte
	for len(ents) > 0 {
		k, used := 0, 0
		for k < len(ents) && used+direntSize+len(ents[k].name) <= blockSize {
			used += direntSize + len(ents[k].name)
			k++
		}
		b := make([]byte, used)
		nameOff := k * direntSize
		for i, e := range ents[:k] {
			d := b[i*direntSize:]
			binary.LittleEndian.PutUint64(d[0:], e.nid)
			binary.LittleEndian.PutUint16(d[8:], uint16(nameOff))
			d[10] = e.ft
			nameOff += copy(b[nameOff:], e.name)
		}
		blocks = append(blocks, b)
		ents = ents[k:]
	}
	return blocks
}

func fileType(m fs.FileMode) uint8 {
	switch {
	case m.IsDir():
		return ftDir
	case m&fs.ModeSymlink != 0:
		return ftSymlink
	}
	return ftRegular
}

// unixMode is m as st_mode.
func unixMode(m fs.FileMode) uint16 {
	mode := uint16(m.Perm())
	if m&fs.ModeSetuid != 0 {
		mode |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		mode |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		mode |= 0o1000
	}
	switch {
	case m.IsDir():
		return mode | 0o040000
	case m&fs.ModeSymlink != 0:
		return mode | 0o120000
	}
	return mode | 0o100000
}

func superBlock(rootNid uint64, inodes int, size uint64) []byte {
	b := make([]byte, blockSize)
	sb := b[sbOffset:]
	binary.LittleEndian.PutUint32(sb[0:], magic)
	sb[12] = blockBits
	binary.LittleEndian.PutUint16(sb[14:], uint16(rootNid))
	binary.LittleEndian.PutUint64(sb[16:], uint64(inodes))
	binary.LittleEndian.PutUint32(sb[36:], uint32(size>>blockBits)) // blocks
	// meta_blkaddr (40) and xattr_blkaddr (44) are 0; no features.
	return b
}

func inode(n *Node) []byte {
	b := make([]byte, inodeSize)
	binary.LittleEndian.PutUint16(b[0:], layoutExtended|dataFlatPlain<<1)
	binary.LittleEndian.PutUint16(b[4:], unixMode(n.Mode))
	binary.LittleEndian.PutUint64(b[8:], n.size)
	binary.LittleEndian.PutUint32(b[16:], n.blkOff)
	binary.LittleEndian.PutUint32(b[20:], uint32(n.nid))
	binary.LittleEndian.PutUint32(b[24:], n.UID)
	binary.LittleEndian.PutUint32(b[28:], n.GID)
	if !n.ModTime.IsZero() && n.ModTime.Unix() > 0 {
		binary.LittleEndian.PutUint64(b[32:], uint64(n.ModTime.Unix()))
		binary.LittleEndian.PutUint32(b[40:], uint32(n.ModTime.Nanosecond()))
	}
	nlink := uint32(1)
	if n.Mode.IsDir() {
		nlink = 2
		for _, c := range n.Children {
			if c.Mode.IsDir() {
				nlink++
			}
		}
	}
	binary.LittleEndian.PutUint32(b[44:], nlink)
	return b
}

func writeData(ew *errWriter, n *Node) error {
	switch {
	case n.size == 0:
		return nil
	case n.Mode.IsDir():
		for _, blk := range n.dir {
			ew.write(blk)
			ew.pad()
		}
	case n.Mode&fs.ModeSymlink != 0:
		ew.write([]byte(n.Target))
		ew.pad()
	default:
		if n.Open == nil {
			return fmt.Errorf("erofs: %q has no content", n.Name)
		}
		r, err := n.Open()
		if err != nil {
			return fmt.Errorf("erofs: open %q: %w", n.Name, err)
		}
		got, err := io.Copy(ew, io.LimitReader(r, int64(n.size)+1))
		r.Close()
		if err != nil {
			return fmt.Errorf("erofs: read %q: %w", n.Name, err)
		}
		if uint64(got) != n.size {
			return fmt.Errorf("erofs: %q changed: %d bytes, not %d", n.Name, got, n.size)
		}
		ew.pad()
	}
	return ew.err
}

// errWriter counts what it wrote and keeps the first error.
type errWriter struct {
	w   io.Writer
	n   int64
	err error
}

func (e *errWriter) Write(p []byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	n, err := e.w.Write(p)
	e.n += int64(n)
	e.err = err
	return n, err
}

func (e *errWriter) write(p []byte) { _, _ = e.Write(p) }

// pad fills to the next block.
func (e *errWriter) pad() {
	if r := e.n % blockSize; r != 0 {
		e.write(make([]byte, blockSize-r))
	}
}
