package errkind

import (
	"errors"
	"fmt"
	"testing"
)

func TestRefusal(t *testing.T) {
	base := errors.New("x")
	for _, c := range []struct {
		err  error
		want bool
	}{
		{PermissionDenied(base), true},
		{fmt.Errorf("wrapped: %w", NotFound(base)), true},
		{InvalidArgument(base), true},
		{FailedPrecondition(base), true},
		{ResourceExhausted(base), true},
		{base, false},
		{fmt.Errorf("write spec: %w", base), false},
		{nil, false},
		// A refusal joined with another error (a cleanup that failed
		// too) is still a refusal.
		{errors.Join(PermissionDenied(base), errors.New("cleanup failed")), true},
		{errors.Join(base, errors.New("y")), false},
	} {
		if got := Refusal(c.err); got != c.want {
			t.Errorf("Refusal(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
