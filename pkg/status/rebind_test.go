package status_test

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/tidemark/tidemark/pkg/status"
)

// TestControlsRefuseAReboundHost: the docs recommend binding the controls
// to 127.0.0.1 (kubectl port-forward) and claim that "a page elsewhere
// cannot pause a partition through an operator's browser". A page at
// http://evil.example:8080 whose name is rebound to 127.0.0.1 (DNS
// rebinding) is same-origin to itself: the browser sends Host and Origin
// both evil.example:8080 and Sec-Fetch-Site: same-origin, which
// CrossOriginProtection lets through. The controls must refuse a Host that
// is not the address operators use (a loopback or IP literal, or a
// configured name).
func TestControlsRefuseAReboundHost(t *testing.T) {
	f := newFake()
	h := status.New(f, status.Controls(true)).Handler()
	req := httptest.NewRequest("POST", "http://evil.example:8080/tidemark/pause",
		strings.NewReader(url.Values{"topic": {"orders"}, "partition": {"3"}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", "http://evil.example:8080")
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusForbidden && rec.Code != http.StatusMisdirectedRequest {
		t.Errorf("a rebound page's POST (Host evil.example:8080) answered %d %q, want 403 or 421; the runner was called %q",
			rec.Code, strings.TrimSpace(rec.Body.String()), f.got())
	}
}
