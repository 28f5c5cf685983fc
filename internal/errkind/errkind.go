// Package errkind marks an error with the kind containerd's errdefs know,
// keeping its message: errgrpc.ToGRPC then gives it the matching gRPC code
// (a refused role reaches the kubelet as PermissionDenied, not Unknown).
// errdefs.Resolve finds the kind through these types' methods.
package errkind

import "errors"

type kinded struct{ err error }

func (k kinded) Error() string { return k.err.Error() }
func (k kinded) Unwrap() error { return k.err }

type permissionDenied struct{ kinded }

func (permissionDenied) Forbidden() {}

type invalidArgument struct{ kinded }

func (invalidArgument) InvalidParameter() {}

type notFound struct{ kinded }

func (notFound) NotFound() {}

type failedPrecondition struct{ kinded }

func (failedPrecondition) FailedPrecondition() {}

type resourceExhausted struct{ kinded }

func (resourceExhausted) ResourceExhausted() {}

// PermissionDenied: the request asks for more than policy grants (an
// unbound role, a mount or host option the role refuses).
func PermissionDenied(err error) error {
	return wrap(err, func(k kinded) error { return permissionDenied{k} })
}

// InvalidArgument: a config, policy or request that does not parse or
// validate.
func InvalidArgument(err error) error {
	return wrap(err, func(k kinded) error { return invalidArgument{k} })
}

// NotFound: a role or sandbox that does not exist.
func NotFound(err error) error { return wrap(err, func(k kinded) error { return notFound{k} }) }

// FailedPrecondition: the node is not in a state to run the container (a
// secret file missing, a namespace gone).
func FailedPrecondition(err error) error {
	return wrap(err, func(k kinded) error { return failedPrecondition{k} })
}

// ResourceExhausted: no room for what the container needs (audit space).
func ResourceExhausted(err error) error {
	return wrap(err, func(k kinded) error { return resourceExhausted{k} })
}

func wrap(err error, f func(kinded) error) error {
	if err == nil {
		return nil
	}
	return f(kinded{err})
}

// Refusal says err is a decision about the request (policy, input, the
// node's state for it), not a fault of the runtime: the caller gets it
// with its reason, and the shim logs it as a warning.
func Refusal(err error) bool {
	var (
		p permissionDenied
		i invalidArgument
		n notFound
		f failedPrecondition
		r resourceExhausted
	)
	return errors.As(err, &p) || errors.As(err, &i) || errors.As(err, &n) || errors.As(err, &f) || errors.As(err, &r)
}
