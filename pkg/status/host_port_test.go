package status_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/tidemark/tidemark/pkg/status"
)

// TestAllowHostsWithPort: AllowHosts says names are compared without the
// port, but only the request's port is dropped: a name given as an
// operator copies it from a URL ("orders.prod.svc:8081") never matches,
// and the page answers 421 to the very address it was told to serve,
// with no error at New to say why.
func TestAllowHostsWithPort(t *testing.T) {
	h := status.New(newFake(), status.AllowHosts("orders.prod.svc:8081")).Handler()
	req := httptest.NewRequest("GET", "/tidemark.json", nil)
	req.Host = "orders.prod.svc:8081"
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code == http.StatusMisdirectedRequest {
		t.Errorf("AllowHosts(%q), Host %q: %d %q; want it served (or the name refused up front)", "orders.prod.svc:8081", req.Host, rec.Code, rec.Body.String())
	}
}
