package shim

import (
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"agentbox.dev/agentbox/internal/cgroups"
)

func TestLimitsAfter(t *testing.T) {
	i64 := func(v int64) *int64 { return &v }
	u64 := func(v uint64) *uint64 { return &v }
	for _, tc := range []struct {
		name        string
		res         *specs.LinuxResources
		mem, millis int64
		cpu         *cgroups.Quota
	}{
		{"no update", nil, 64 << 20, 500, nil},
		{"nothing in it", &specs.LinuxResources{}, 64 << 20, 500, nil},
		{"memory lowered", &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: i64(32 << 20)}}, 32 << 20, 500, nil},
		{"memory unbounded (-1) is none, not negative", &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: i64(-1)}}, 0, 500, nil},
		{"memory without a limit keeps it", &specs.LinuxResources{Memory: &specs.LinuxMemory{Swap: i64(1)}}, 64 << 20, 500, nil},
		{"cpu lowered", &specs.LinuxResources{CPU: &specs.LinuxCPU{Quota: i64(25000), Period: u64(100000)}}, 64 << 20, 250, &cgroups.Quota{Quota: 25000, Period: 100000}},
		{"cpu unbounded (-1) is none, not negative", &specs.LinuxResources{CPU: &specs.LinuxCPU{Quota: i64(-1), Period: u64(100000)}}, 64 << 20, 0, &cgroups.Quota{}},
		{"cpu quota without a period keeps it", &specs.LinuxResources{CPU: &specs.LinuxCPU{Quota: i64(25000)}}, 64 << 20, 500, nil},
		{"cpu shares alone keep it", &specs.LinuxResources{CPU: &specs.LinuxCPU{Shares: u64(2)}}, 64 << 20, 500, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mem, millis, cpu := limitsAfter(64<<20, 500, tc.res)
			if mem != tc.mem || millis != tc.millis {
				t.Errorf("limits %d bytes %dm, want %d bytes %dm", mem, millis, tc.mem, tc.millis)
			}
			if (cpu == nil) != (tc.cpu == nil) || (cpu != nil && *cpu != *tc.cpu) {
				t.Errorf("cpu %+v, want %+v", cpu, tc.cpu)
			}
		})
	}
}
