package audit

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/moat-sandbox/moat/confirmation"
)

// maxShownArgv caps the argv shown per process line of a timeline.
const maxShownArgv = 200

// timeLayout is a timeline's time column.
const timeLayout = "2006-01-02T15:04:05.000Z07:00"

// WriteTimeline writes journal as a readable timeline, one line per
// record: a mark ("!!" for a refused or failed request, a boundary that was
// not ready, a line that cannot be read), the time, the sequence number,
// the type and the record's key fields (Describe). A torn tail (the last
// line without its LF) is shown as such. Signatures are NOT checked: the
// timeline is for reading, Verify is for trusting.
func WriteTimeline(w io.Writer, journal []byte) {
	eachLine(journal, func(n int, line []byte, torn bool) {
		if torn {
			fmt.Fprintf(w, "   %-24s %5d  (torn tail of %d bytes: a write cut short)\n", "", n, len(line))
			return
		}
		e, err := ParseLine(line)
		if err != nil {
			fmt.Fprintf(w, "!! %-24s %5d  UNREADABLE: %v\n", "", n, err)
			return
		}
		mark, typ := "  ", e.Header.Type
		switch r := e.Record.(type) {
		case InferenceRefused:
			mark, typ = "!!", "REFUSED "+typ
		case InferenceFailed:
			mark, typ = "!!", "FAILED "+typ
		case ServiceRefused:
			mark, typ = "!!", "REFUSED "+typ
		case ServiceFailed:
			mark, typ = "!!", "FAILED "+typ
		case EgressRefused:
			mark, typ = "!!", "REFUSED "+typ
		case PackageRefused:
			mark, typ = "!!", "REFUSED "+typ
		case PackageFailed:
			mark, typ = "!!", "FAILED "+typ
		case PackageReload:
			if r.Outcome == ReloadRefused {
				mark, typ = "!!", "REFUSED "+typ
			}
		case ApprovalSubstitution:
			mark, typ = "!!", "SUBSTITUTION "+typ
		case BoundaryConfirmed:
			if !r.Ready {
				mark = "!!"
			}
		}
		fmt.Fprintf(w, "%s %-24s %5d  %-28s %s\n", mark, e.Header.Time.Format(timeLayout), e.Header.Seq, typ, Describe(e.Record))
	})
}

// Payloads returns the payload of each whole line of journal, in order,
// and the first line that cannot be parsed, if any (the lines after it are
// still returned). A torn tail is left out. Signatures are NOT checked.
func Payloads(journal []byte) ([]json.RawMessage, error) {
	recs := []json.RawMessage{}
	var firstErr error
	eachLine(journal, func(n int, line []byte, torn bool) {
		if torn {
			return
		}
		e, err := ParseLine(line)
		if err != nil {
			if firstErr == nil {
				firstErr = fmt.Errorf("line %d: %w", n, err)
			}
			return
		}
		recs = append(recs, e.Payload)
	})
	return recs, firstErr
}

// eachLine yields each LF-terminated line (numbered from 1) and then any
// unterminated tail.
func eachLine(journal []byte, fn func(n int, line []byte, torn bool)) {
	n := 0
	for len(journal) > 0 {
		n++
		line, rest, ok := bytes.Cut(journal, []byte("\n"))
		fn(n, line, !ok)
		journal = rest
	}
}

// Describe is a record's key fields on one line, as a timeline shows them.
func Describe(r Record) string {
	switch r := r.(type) {
	case RunStarted:
		s := fmt.Sprintf("backend=%s policy=%s binary=%s", r.Backend, short(r.PolicySHA256), short(r.BinarySHA256))
		for _, lf := range r.Lockfiles {
			s += fmt.Sprintf(" lockfile=%s:%s:%s", strconv.Quote(lf.Path), short(lf.SHA256), lf.Trust)
		}
		return s
	case BoundaryConfirmed:
		p := r.Properties
		prop := func(name string, e confirmation.EnforcedProperty) string {
			if e.Enforced {
				return name + "=" + e.Mechanism
			}
			return name + "=NOT-ENFORCED"
		}
		s := fmt.Sprintf("ready=%t %s %s %s %s", r.Ready,
			prop("fs", p.FilesystemConfinement), prop("egress", p.EgressInterception),
			prop("attribution", p.RequestAttribution), prop("privilege", p.PrivilegeFloor))
		if r.Reason != "" {
			s += " reason=" + strconv.Quote(r.Reason)
		}
		return s
	case ToolServerConfirmed:
		return "server=" + strconv.Quote(r.Server) + " " + Describe(BoundaryConfirmed{Ready: r.Ready, Properties: r.Properties, Reason: r.Reason})
	case InferenceRequested:
		return fmt.Sprintf("id=%s %s %s model=%s stream=%t reserved=%d %s", r.RequestID, r.Provider, r.Endpoint, r.Model, r.Stream, r.ReservedTokens, describeAttribution(r.Attribution))
	case InferenceCompleted:
		return fmt.Sprintf("id=%s status=%d bytes=%d tokens=%d/%d", r.RequestID, r.Status, r.ResponseBytes, r.Usage.InputTokens, r.Usage.OutputTokens)
	case InferenceRefused:
		return fmt.Sprintf("id=%s reason=%s %s detail=%s", r.RequestID, r.Reason, describeAttribution(r.Attribution), strconv.Quote(r.Detail))
	case InferenceFailed:
		return fmt.Sprintf("id=%s reason=%s detail=%s", r.RequestID, r.Reason, strconv.Quote(r.Detail))
	case ProcessStarted:
		return fmt.Sprintf("id=%s pid=%d argv=[%s]", r.ProcessID, r.HostPID, shownArgv(r.Argv))
	case ProcessExited:
		if r.OOMKilled {
			return fmt.Sprintf("id=%s exit=%d oom_killed", r.ProcessID, r.ExitCode)
		}
		return fmt.Sprintf("id=%s exit=%d", r.ProcessID, r.ExitCode)
	case ProcessFailed:
		return fmt.Sprintf("exit=%d argv=[%s] reason=%s", r.ExitCode, shownArgv(r.Argv), strconv.Quote(r.Reason))
	case ToolRequested:
		return fmt.Sprintf("call=%s server=%s tool=%s args=%s bytes=%d %s", r.CallID, r.Server, r.Tool, short(r.ArgumentsSHA256), r.ArgumentsBytes, describeAttribution(r.Attribution))
	case ToolCompleted:
		return fmt.Sprintf("call=%s result=%s bytes=%d is_error=%t", r.CallID, short(r.ResultSHA256), r.ResultBytes, r.IsError)
	case ToolRefused:
		return fmt.Sprintf("call=%s server=%s method=%s tool=%s reason=%s %s detail=%s", r.CallID, strconv.Quote(r.Server), strconv.Quote(r.Method), strconv.Quote(r.Tool), r.Reason, describeAttribution(r.Attribution), strconv.Quote(r.Detail))
	case ToolFailed:
		return fmt.Sprintf("call=%s reason=%s detail=%s", r.CallID, r.Reason, strconv.Quote(r.Detail))
	case ServiceRequested, ServiceCompleted, ServiceRefused, ServiceFailed:
		return describeService(r)
	case EgressOpened, EgressClosed, EgressRefused:
		return describeEgress(r)
	case PackageRequested, PackageCompleted, PackageRefused, PackageFailed, PackageLockfile, PackageReload:
		return describePackage(r)
	case ApprovalRequested, ApprovalDecided, ApprovalSubstitution:
		return describeApproval(r)
	case BudgetUpdated:
		return describeBudget(r)
	case RunTerminated:
		c := r.Counts
		s := fmt.Sprintf("reason=%s exit=%d requested=%d completed=%d refused=%d failed=%d processes=%d",
			r.Reason, r.ExitCode, c.Requested, c.Completed, c.Refused, c.Failed, c.Processes)
		if t := c.Tools; t != (ToolCounts{}) {
			s += fmt.Sprintf(" tool_requested=%d tool_completed=%d tool_refused=%d tool_failed=%d", t.Requested, t.Completed, t.Refused, t.Failed)
		}
		return s
	}
	return fmt.Sprintf("BUG: unknown record %T", r)
}

func short(h string) string {
	if len(h) > 12 {
		return h[:12]
	}
	return h
}

func describeAttribution(a Attribution) string {
	if a.Status == confirmation.AttributionResolved {
		return fmt.Sprintf("pid=%d exe=%s", a.PID, a.Executable)
	}
	return fmt.Sprintf("attribution=%s(%s)", a.Status, a.Reason)
}

// shownArgv is argv quoted, cut at maxShownArgv bytes.
func shownArgv(argv []string) string {
	q := make([]string, len(argv))
	for i, a := range argv {
		q[i] = strconv.Quote(a)
	}
	s := strings.Join(q, " ")
	if len(s) > maxShownArgv {
		s = s[:maxShownArgv] + "…"
	}
	return s
}
