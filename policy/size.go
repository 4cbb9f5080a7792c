package policy

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// MaxSize caps every size in a policy (1Ti): larger values are mistakes,
// and the cap keeps arithmetic on sizes far from overflow.
const MaxSize Size = 1 << 40

var sizeUnits = []struct {
	suffix string
	shift  uint
}{
	{"Ti", 40}, {"Gi", 30}, {"Mi", 20}, {"Ki", 10},
}

// ParseSize parses a size written as a plain decimal integer of bytes or as
// an integer with a binary suffix: Ki, Mi, Gi or Ti (e.g. 64Mi). Decimal
// suffixes (K, M, G, MB …), fractions, signs and spaces are refused so that
// no size is ambiguous. The result is in [0, MaxSize].
func ParseSize(s string) (Size, error) {
	num, shift := s, uint(0)
	for _, u := range sizeUnits {
		if strings.HasSuffix(s, u.suffix) {
			num, shift = strings.TrimSuffix(s, u.suffix), u.shift
			break
		}
	}
	if num == "" {
		return 0, fmt.Errorf("size %q has no number; write e.g. 64Mi, 1Gi or a number of bytes", s)
	}
	for _, c := range num {
		if c < '0' || c > '9' {
			if c == '-' {
				return 0, fmt.Errorf("size %q is negative", s)
			}
			return 0, fmt.Errorf("size %q is not an integer with an optional Ki, Mi, Gi or Ti suffix (e.g. 64Mi)", s)
		}
	}
	n, err := strconv.ParseUint(num, 10, 64)
	if err != nil || n > uint64(MaxSize)>>shift {
		return 0, fmt.Errorf("size %q is larger than the limit %s", s, MaxSize)
	}
	return Size(n << shift), nil
}

// String writes s with the largest binary suffix that divides it exactly
// (64Mi, 1Gi), or as plain bytes.
func (s Size) String() string {
	if s > 0 {
		for _, u := range sizeUnits {
			if s%(1<<u.shift) == 0 {
				return strconv.FormatInt(int64(s>>u.shift), 10) + u.suffix
			}
		}
	}
	return strconv.FormatInt(int64(s), 10)
}

// MarshalYAML writes the size as String does, so that printed policies read
// like the ones people write and load back unchanged.
func (s Size) MarshalYAML() (any, error) {
	if s < 0 {
		return nil, errors.New("BUG: negative size")
	}
	if s%1024 == 0 && s > 0 {
		return s.String(), nil
	}
	return int64(s), nil
}
