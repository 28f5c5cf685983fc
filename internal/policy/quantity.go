package policy

// Quantities as roles and Kubernetes write them: CPU, memory, durations.

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// parseCPU parses cores: "2", "0.5", "500m".
func parseCPU(v *string, def int64) (int64, error) {
	if v == nil {
		return def, nil
	}
	s := strings.TrimSpace(*v)
	var m float64
	if strings.HasSuffix(s, "m") {
		n, err := strconv.ParseInt(strings.TrimSuffix(s, "m"), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%q is not a CPU amount (like 1, 0.5 or 500m)", *v)
		}
		m = float64(n)
	} else {
		f, err := strconv.ParseFloat(s, 64)
		if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
			return 0, fmt.Errorf("%q is not a CPU amount (like 1, 0.5 or 500m)", *v)
		}
		m = f * 1000
	}
	if m < 10 || m > 1024*1000 {
		return 0, fmt.Errorf("%q is not between 10m and 1024 cores", *v)
	}
	return int64(m), nil
}

var byteUnits = map[string]int64{
	"": 1, "k": 1000, "K": 1000, "M": 1000 * 1000, "G": 1000 * 1000 * 1000, "T": 1000 * 1000 * 1000 * 1000,
	"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40,
}

var bytesRE = lazy(`^([0-9]{1,15})([kKMGT]i?)?$`)

// parseBytes parses "512Mi", "2Gi", "1G", "1048576".
func parseBytes(v *string, def int64) (int64, error) {
	if v == nil {
		return def, nil
	}
	m := bytesRE.FindStringSubmatch(strings.TrimSpace(*v))
	if m == nil {
		return 0, fmt.Errorf("%q is not an amount of memory (like 512Mi or 2Gi)", *v)
	}
	n, _ := strconv.ParseInt(m[1], 10, 64)
	unit := byteUnits[m[2]]
	if n > math.MaxInt64/unit {
		return 0, fmt.Errorf("%q is too large", *v)
	}
	return n * unit, nil
}

// parseDuration parses a positive Go duration ("30m", "1h30m").
func parseDuration(v *string, def time.Duration) (time.Duration, error) {
	if v == nil {
		return def, nil
	}
	d, err := time.ParseDuration(strings.TrimSpace(*v))
	if err != nil {
		return 0, fmt.Errorf("%q is not a duration (like 90s, 30m or 1h)", *v)
	}
	if d <= 0 {
		return 0, fmt.Errorf("%q must be positive", *v)
	}
	return d, nil
}

// ParseCPU parses a CPU amount as roles and Kubernetes write it ("2",
// "0.5", "500m") into millicores.
func ParseCPU(s string) (int64, error) { return parseCPU(&s, 0) }

// ParseMemory parses an amount of memory as roles and Kubernetes write it
// ("512Mi", "2Gi", "1G") into bytes.
func ParseMemory(s string) (int64, error) { return parseBytes(&s, 0) }
