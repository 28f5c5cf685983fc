package errkind

import (
	"errors"
	"fmt"
	"testing"

	"github.com/containerd/errdefs/pkg/errgrpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestKindsReachGRPC(t *testing.T) {
	base := errors.New(`role "coder" is not bound`)
	for _, tc := range []struct {
		err  error
		code codes.Code
	}{
		{PermissionDenied(base), codes.PermissionDenied},
		{InvalidArgument(base), codes.InvalidArgument},
		{NotFound(base), codes.NotFound},
		{FailedPrecondition(base), codes.FailedPrecondition},
		{ResourceExhausted(base), codes.ResourceExhausted},
		// Wrapped further, as the shim does, the kind survives.
		{fmt.Errorf("agentbox: container x refused: %w", PermissionDenied(base)), codes.PermissionDenied},
		{base, codes.Unknown},
	} {
		st, _ := status.FromError(errgrpc.ToGRPC(tc.err))
		if st.Code() != tc.code || st.Message() != tc.err.Error() {
			t.Errorf("%v: code %v message %q, want %v and the message unchanged", tc.err, st.Code(), st.Message(), tc.code)
		}
		if !errors.Is(tc.err, base) {
			t.Errorf("%v must still wrap its cause", tc.err)
		}
	}
	if PermissionDenied(nil) != nil {
		t.Error("nil stays nil")
	}
}
