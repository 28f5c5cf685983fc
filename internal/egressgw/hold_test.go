package egressgw

import (
	"context"
	"testing"
	"time"
)

func TestAwaitKey(t *testing.T) {
	g := &Gateway{}
	g.ctx, g.stop = context.WithCancel(context.Background())
	defer g.stop()
	if d, held := g.awaitKey(context.Background(), "vendor.test"); d != 0 || held {
		t.Fatalf("nothing held: waited %v, %v", d, held)
	}
	g.HoldFor([]string{"vendor.test"})
	if d, held := g.awaitKey(context.Background(), "other.test"); d != 0 || held {
		t.Fatalf("another host: waited %v, %v", d, held)
	}
	// Released (the claim decided): the request goes on, not before.
	go func() {
		time.Sleep(50 * time.Millisecond)
		g.HoldFor([]string{"elsewhere.test", "vendor.test"}) // a change that keeps it held
		time.Sleep(50 * time.Millisecond)
		g.HoldFor(nil)
	}()
	if d, held := g.awaitKey(context.Background(), "vendor.test"); held || d < 100*time.Millisecond {
		t.Fatalf("released: waited %v, held %v", d, held)
	}
	// The request's end ends its wait, said as not given.
	g.HoldFor([]string{"vendor.test"})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	if d, held := g.awaitKey(ctx, "vendor.test"); !held || d < 30*time.Millisecond {
		t.Fatalf("the request ended: waited %v, held %v", d, held)
	}
}
