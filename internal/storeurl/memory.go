package storeurl

import (
	"fmt"
	"math"
	"net/url"
	"strconv"
	"strings"

	"github.com/idem-dev/idem/idemmem"
)

// parseMemory reads memory://[?max_records=N&max_bytes=SIZE]. Each bound
// takes a positive number, or "unlimited"; left out, it is idemmem's
// default.
func (t *Target) parseMemory(rest string) error {
	if rest == "" {
		return nil
	}
	query, ok := strings.CutPrefix(rest, "?")
	if !ok {
		return fmt.Errorf("memory:// takes only parameters, as in memory://?max_records=100000&max_bytes=256MiB; got %q after the scheme", rest)
	}
	q, err := url.ParseQuery(query)
	if err != nil {
		return err
	}
	for name, vs := range q {
		v := vs[len(vs)-1]
		switch name {
		case "max_records":
			n, err := parseBound(v, func(s string) (int64, error) { return strconv.ParseInt(s, 10, 64) })
			if err != nil || n == 0 || n > math.MaxInt32 {
				return fmt.Errorf("max_records must be a positive whole number (at most %d) or unlimited, got %q", math.MaxInt32, v)
			}
			t.mem.MaxRecords = int(n)
		case "max_bytes":
			n, err := parseBound(v, ParseSize)
			if err != nil {
				return fmt.Errorf("max_bytes: %v", err)
			}
			if n >= 0 && n < idemmem.MinMaxBytes {
				return fmt.Errorf("max_bytes %q is too small to hold a few records; want at least %d bytes, or unlimited", v, idemmem.MinMaxBytes)
			}
			t.mem.MaxBytes = n
		default:
			return fmt.Errorf("unknown memory parameter %q (known: max_records, max_bytes)", name)
		}
	}
	return nil
}

// parseBound returns -1 for "unlimited" and parse(v) otherwise.
func parseBound(v string, parse func(string) (int64, error)) (int64, error) {
	if strings.EqualFold(v, "unlimited") {
		return -1, nil
	}
	n, err := parse(v)
	if err == nil && n < 0 {
		err = fmt.Errorf("%q is negative", v)
	}
	return n, err
}

// sizeUnits are the suffixes ParseSize accepts, compared without regard to
// case: bytes, the decimal units and the binary ones.
var sizeUnits = map[string]int64{
	"": 1, "b": 1,
	"kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
	"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
}

// ParseSize reads a size in bytes: a whole number, optionally followed by
// a unit, B, KB, MB, GB or TB (powers of 1000) or KiB, MiB, GiB or TiB
// (powers of 1024), in any case and with or without a space: "1048576",
// "256MiB", "64 mb".
func ParseSize(s string) (int64, error) {
	i := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	if i == 0 {
		return 0, fmt.Errorf("size %q must be a whole number of bytes, optionally with a unit (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)", s)
	}
	unit, ok := sizeUnits[strings.ToLower(strings.TrimSpace(s[i:]))]
	if !ok {
		return 0, fmt.Errorf("size %q has an unknown unit %q; use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB", s, strings.TrimSpace(s[i:]))
	}
	n, err := strconv.ParseInt(s[:i], 10, 64)
	if err != nil || n > math.MaxInt64/unit {
		return 0, fmt.Errorf("size %q is too large", s)
	}
	return n * unit, nil
}
