package audit

import (
	"fmt"
	"strconv"
)

// Brokered service records (egress.services, issue 13 item 2). A request
// the workload sends to /svc/<name>/... that the broker admits is
// journaled as service.requested, durable before the request leaves for
// the service, and then closed by exactly one service.completed or
// service.failed with the same request_id. A request the broker does not
// admit (a method, path or query the grant does not list, a header it
// refuses, no allowance left) is journaled as service.refused and never
// reaches the service.
const (
	TypeServiceRequested = "service.requested"
	TypeServiceCompleted = "service.completed"
	TypeServiceRefused   = "service.refused"
	TypeServiceFailed    = "service.failed"
)

// ServiceRequested is the pre-effect record of one brokered service
// request.
type ServiceRequested struct {
	RequestID string `json:"request_id"` // "moatreq_" and 24 hex digits, unique in the run
	Service   string `json:"service"`    // the policy's egress.services name
	Method    string `json:"method"`
	// Path is the path sent to the service, below its base_url's path;
	// Query the query string sent (only parameters the grant allows),
	// absent when there is none.
	Path  string `json:"path"`
	Query string `json:"query,omitempty"`
	// HeadersSHA256 is the SHA-256 of the workload-influenced headers
	// forwarded, as "name: value\n" lines (lower-case names, sorted).
	HeadersSHA256 string `json:"headers_sha256"`
	// BodySHA256 and BodyBytes cover the exact body bytes sent to the
	// service (decoded, when the workload sent it compressed).
	BodySHA256 string `json:"body_sha256"`
	BodyBytes  int64  `json:"body_bytes"`
	// ContentEncoding is the workload's Content-Encoding (gzip), and
	// EncodedSHA256 and EncodedBytes the body as the workload sent it;
	// all three are absent for an uncompressed body.
	ContentEncoding string      `json:"content_encoding,omitempty"`
	EncodedSHA256   string      `json:"encoded_sha256,omitempty"`
	EncodedBytes    int64       `json:"encoded_bytes,omitempty"`
	Attribution     Attribution `json:"attribution"`
}

// ServiceCompleted records a service's answer passed to the workload.
type ServiceCompleted struct {
	RequestID string `json:"request_id"`
	Status    int    `json:"status"`
	// BodySHA256 and BodyBytes cover the exact body bytes given to the
	// workload.
	BodySHA256 string `json:"body_sha256"`
	BodyBytes  int64  `json:"body_bytes"`
}

// ServiceRefused records a request to a service that the broker refused;
// it never reached the service.
type ServiceRefused struct {
	RequestID   string      `json:"request_id"`
	Service     string      `json:"service,omitempty"` // absent when the path names no granted service
	Method      string      `json:"method"`
	Reason      string      `json:"reason"` // a reason code, e.g. "service_path_not_allowed"
	Detail      string      `json:"detail"` // the message the workload was given
	Attribution Attribution `json:"attribution"`
}

// ServiceFailed closes a service.requested whose answer was not passed
// to the workload: the service failed, redirected or timed out, or its
// answer was withheld (a reflected credential).
type ServiceFailed struct {
	RequestID string `json:"request_id"`
	Status    int    `json:"status,omitempty"` // the service's status, when it answered
	Reason    string `json:"reason"`
	Detail    string `json:"detail"`
}

func (ServiceRequested) RecordType() string { return TypeServiceRequested }
func (ServiceCompleted) RecordType() string { return TypeServiceCompleted }
func (ServiceRefused) RecordType() string   { return TypeServiceRefused }
func (ServiceFailed) RecordType() string    { return TypeServiceFailed }

// describeService is audit show's line for a service record.
func describeService(r Record) string {
	switch r := r.(type) {
	case ServiceRequested:
		s := fmt.Sprintf("id=%s service=%s %s %s", r.RequestID, r.Service, r.Method, strconv.Quote(r.Path))
		if r.Query != "" {
			s += " query=" + strconv.Quote(r.Query)
		}
		s += fmt.Sprintf(" headers=%s body=%s bytes=%d", short(r.HeadersSHA256), short(r.BodySHA256), r.BodyBytes)
		if r.ContentEncoding != "" {
			s += fmt.Sprintf(" encoding=%s encoded=%s encoded_bytes=%d", r.ContentEncoding, short(r.EncodedSHA256), r.EncodedBytes)
		}
		return s + " " + describeAttribution(r.Attribution)
	case ServiceCompleted:
		return fmt.Sprintf("id=%s status=%d body=%s bytes=%d", r.RequestID, r.Status, short(r.BodySHA256), r.BodyBytes)
	case ServiceRefused:
		return fmt.Sprintf("id=%s service=%s method=%s reason=%s %s detail=%s", r.RequestID, strconv.Quote(r.Service), strconv.Quote(r.Method), r.Reason, describeAttribution(r.Attribution), strconv.Quote(r.Detail))
	case ServiceFailed:
		return fmt.Sprintf("id=%s status=%d reason=%s detail=%s", r.RequestID, r.Status, r.Reason, strconv.Quote(r.Detail))
	}
	return fmt.Sprintf("BUG: not a service record %T", r)
}
