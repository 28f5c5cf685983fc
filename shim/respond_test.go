package shim

import (
	"errors"
	"testing"
)

// A quarantine that cannot be applied never leaves the sandbox as it was.
func TestFailClosed(t *testing.T) {
	boom := errors.New("boom")
	for _, tc := range []struct {
		freeze, stop error
		want         string
		stopped, err bool
	}{
		{want: "frozen"},
		{freeze: boom, want: "stopped", stopped: true, err: true},
		{freeze: boom, stop: boom, want: "neither frozen nor stopped", stopped: true, err: true},
	} {
		stopped := false
		got, err := fallBack(func() error { return tc.freeze }, func() error { stopped = true; return tc.stop })
		if got != tc.want || stopped != tc.stopped || (err != nil) != tc.err {
			t.Errorf("freeze %v stop %v: got %q stopped %v err %v", tc.freeze, tc.stop, got, stopped, err)
		}
	}
}
