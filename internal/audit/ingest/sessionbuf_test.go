package ingest

import (
	"bytes"
	"testing"
)

// A large message's pages beyond keptBuffer go back to the kernel (they
// read as zeros again); the first keptBuffer bytes, and the buffer after a
// small message, are left as they were.
func TestSessionBufferRelease(t *testing.T) {
	sb, err := newSessionBuffer()
	if err != nil {
		t.Fatal(err)
	}
	defer sb.free()
	if len(sb.b) != MaxMessageSize+1 {
		t.Fatalf("buffer is %d bytes, want %d", len(sb.b), MaxMessageSize+1)
	}
	fill := func() {
		for i := range sb.b {
			sb.b[i] = 0xa5
		}
	}
	fill()
	sb.release(keptBuffer) // not larger than what is kept: nothing released
	if sb.b[len(sb.b)-1] != 0xa5 {
		t.Fatal("a message of keptBuffer bytes released pages")
	}
	sb.release(MaxMessageSize)
	if !bytes.Equal(sb.b[:keptBuffer], bytes.Repeat([]byte{0xa5}, keptBuffer)) {
		t.Fatal("the kept part of the buffer changed")
	}
	if !bytes.Equal(sb.b[keptBuffer:], make([]byte, len(sb.b)-keptBuffer)) {
		t.Fatal("pages past keptBuffer are still resident after a large message")
	}
}
