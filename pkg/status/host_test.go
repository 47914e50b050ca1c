package status_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/tidemark/tidemark/pkg/status"
)

// TestHosts: every route, reads included, answers only to an IP address,
// a loopback name or a name of AllowHosts; a DNS name could be rebound to
// this address by a page an operator's browser opened.
func TestHosts(t *testing.T) {
	h := status.New(newFake(), status.Controls(true), status.AllowHosts("Orders.Prod.svc.", "other")).Handler()
	for _, c := range []struct {
		host string
		ok   bool
	}{
		{"127.0.0.1:8081", true},
		{"127.0.0.1", true},
		{"10.1.2.3:80", true},
		{"[::1]:8081", true},
		{"[fe80::1]", true},
		{"localhost:8081", true},
		{"LOCALHOST.", true},
		{"pod.localhost:1", true},
		{"orders.prod.svc:8081", true},
		{"orders.prod.svc.", true},
		{"other", true},
		{"evil.example:8080", false},
		{"example.com", false},
		{"localhost.evil.example", false},
		{"orders.prod.svc.evil.example", false},
		{"127.0.0.1.nip.io", false},
		{"", false},
	} {
		for _, path := range []string{"/tidemark", "/tidemark.json", "/tidemark/pause"} {
			method := "GET"
			if path == "/tidemark/pause" {
				method = "POST"
			}
			req := httptest.NewRequest(method, path+"?topic=orders", nil)
			req.Host = c.host
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			refused := rec.Code == http.StatusMisdirectedRequest
			if refused == c.ok {
				t.Errorf("%s %s with Host %q: %d %q; want refused=%v", method, path, c.host, rec.Code, rec.Body.String(), !c.ok)
			}
		}
	}
}
