package testbed

import "strings"

// failure is an error with the lines that help: what to read, what to do,
// the end of a log.
type failure struct {
	msg     string
	details []string
}

func fail(msg string, details ...string) error { return &failure{msg: msg, details: details} }

func (f *failure) Error() string {
	var sb strings.Builder
	sb.WriteString(f.msg)
	for _, d := range f.details {
		switch {
		case d == "":
		case strings.Contains(d, "\n"):
			sb.WriteString("\n" + d)
		default:
			sb.WriteString("\n  " + d)
		}
	}
	return sb.String()
}
