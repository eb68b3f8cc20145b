//go:build !linux

package isolation

import (
	"context"
	"errors"
	"fmt"
	"os"
)

// Worker domains need Linux cgroups, pidfds and PDEATHSIG; elsewhere every
// entry point answers errors.ErrUnsupported and the preflight is unverified.

const unsupported = "worker isolation needs Linux (cgroups, pidfd, PDEATHSIG)"

// Host is never usable on this platform.
type Host struct{}

func DefaultRoot() (string, error) { return "", errors.ErrUnsupported }
func CgroupMounts() []string       { return nil }
func Preflight(Config) Report      { return Report{Mode: ModeNone, Detail: unsupported} }
func Open(Config) (*Host, error)   { return nil, errors.ErrUnsupported }
func (h *Host) Epoch() string      { return "" }
func (h *Host) Report() Report     { return Report{Mode: ModeNone, Detail: unsupported} }
func (h *Host) Swept() []string    { return nil }
func (h *Host) Close() error       { return nil }
func (h *Host) Run(context.Context, Spec) (Result, error) {
	return Result{}, errors.ErrUnsupported
}
func BecomeSubreaper() error { return errors.ErrUnsupported }
func ReapOrphans() int       { return 0 }

// ShimMain refuses: there is no domain to run in.
func ShimMain([]string) int {
	fmt.Fprintln(os.Stderr, unsupported)
	return 126
}
