package strictjson

import (
	"math"
	"strconv"
)

// number reads the number at s.i and writes its canonical form: an
// integer of fewer than 16 bytes as written (it is exact as a double),
// "-0" as 0, any other number parsed as a double and printed in the
// ECMAScript form. A number outside the double range is refused.
func (s *canonState) number() bool {
	src := s.src
	j := s.i
	if src[j] == '-' {
		j++
	}
	switch {
	case j == len(src):
		return false
	case src[j] == '0':
		j++
	case '1' <= src[j] && src[j] <= '9':
		j = digits(src, j+1)
	default:
		return false
	}
	isFloat := false
	if j < len(src) && src[j] == '.' {
		k := digits(src, j+1)
		if k == j+1 {
			return false
		}
		j, isFloat = k, true
	}
	if j < len(src) && (src[j] == 'e' || src[j] == 'E') {
		j++
		if j < len(src) && (src[j] == '+' || src[j] == '-') {
			j++
		}
		k := digits(src, j)
		if k == j {
			return false
		}
		j, isFloat = k, true
	}
	num := src[s.i:j]
	s.i = j
	// jsontext's ReformatNumber copies integers shorter than 16 bytes.
	const maxExactIntegerDigits = 16
	switch {
	case string(num) == "-0":
		s.out = append(s.out, '0')
		return true
	case !isFloat && len(num) < maxExactIntegerDigits:
		s.out = append(s.out, num...)
		return true
	}
	f, err := strconv.ParseFloat(string(num), 64)
	if err != nil {
		return false // out of range (walk: ErrNumberRange)
	}
	if f == 0 {
		f = 0 // no negative zero
	}
	s.out = appendNumber(s.out, f)
	return true
}

func digits(b []byte, j int) int {
	for j < len(b) && '0' <= b[j] && b[j] <= '9' {
		j++
	}
	return j
}

// appendNumber writes f in the ECMAScript form (RFC 8785, section
// 3.2.2.3), as jsontext's internal jsonwire.AppendFloat does for 64 bits.
func appendNumber(dst []byte, f float64) []byte {
	abs := math.Abs(f)
	format := byte('f')
	if abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	dst = strconv.AppendFloat(dst, f, format, -1, 64)
	if format == 'e' {
		// e-07 becomes e-7.
		if n := len(dst); n >= 4 && dst[n-4] == 'e' && dst[n-3] == '-' && dst[n-2] == '0' {
			dst[n-2] = dst[n-1]
			dst = dst[:n-1]
		}
	}
	return dst
}
