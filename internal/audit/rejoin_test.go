package audit

import (
	"fmt"
	"sync"
	"testing"
)

// Rejoin changes what records carry at its own record, with nothing in
// between: under a flood of records from another goroutine, every record
// before the owner record carries the warm pool and every one after it
// the claim.
func TestRejoinIsAtItsRecord(t *testing.T) {
	tt := newTestTrail(t, "sb")
	m := tt.trail.Meta()
	m.WarmPool = "pool"
	tt.trail.SetMeta(m)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; i < 2000; i++ {
			tt.trail.Emit(TypeAnomaly.New("Failure", fmt.Sprint(i), nil), false)
		}
	}()
	m.WarmPool, m.Claim = "", &Claim{Name: "task-1", UID: "u", Tenant: "acme"}
	tt.trail.Rejoin(m, TypeOwner.New("Success", "claimed", nil))
	wg.Wait()
	recs := tt.close(t)
	seen := false
	for i, r := range recs {
		if r["event"] == "agentbox/owner" {
			seen = true
		}
		claim, pool := r["claim"], r["warm_pool"]
		switch {
		case r["event"] == EventSandboxEnd:
		case seen && (claim == nil || pool != nil):
			t.Fatalf("record %d after the claim: claim %v, pool %v", i, claim, pool)
		case !seen && (claim != nil || pool != "pool"):
			t.Fatalf("record %d before the claim: claim %v, pool %v", i, claim, pool)
		}
	}
	if !seen {
		t.Fatal("no owner record")
	}
}
