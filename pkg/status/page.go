package status

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tidemark/tidemark/pkg/runner"
)

// Runner is what the page reads and, with Controls, drives; *runner.Runner
// implements it.
type Runner interface {
	Stats() runner.Stats
	OperatorPaused() runner.OperatorPauses
	PausePartitions(ctx context.Context, tps ...runner.TP) error
	ResumePartitions(ctx context.Context, tps ...runner.TP) error
	PauseTopics(ctx context.Context, topics ...string) error
	ResumeTopics(ctx context.Context, topics ...string) error
}

var _ Runner = (*runner.Runner)(nil)

// Page serves one runner's status page. It is safe for concurrent use.
type Page struct {
	r        Runner
	controls bool
	hideKeys bool
	refresh  time.Duration
	timeout  time.Duration
	now      func() time.Time
	hosts    map[string]bool // AllowHosts, lower case
}

// Option configures a Page.
type Option func(*Page)

// Controls turns the pause and resume endpoints on (default off). They
// are an admin surface without authentication: see the package doc.
func Controls(on bool) Option { return func(p *Page) { p.controls = on } }

// HideKeys leaves record keys off the page and its JSON (default: shown,
// clipped). Use it when keys are personal data the page's readers should
// not see.
func HideKeys() Option { return func(p *Page) { p.hideKeys = true } }

// Refresh is how often the HTML page reloads itself (default 5s; zero or
// less: never). The runner refreshes its stats every commit interval.
func Refresh(d time.Duration) Option { return func(p *Page) { p.refresh = d } }

// ControlTimeout bounds a pause or resume request's wait for the runner's
// poll loop (default 10s).
func ControlTimeout(d time.Duration) Option { return func(p *Page) { p.timeout = d } }

// AllowHosts adds DNS names the page answers to (compared without the
// port, case-insensitively; a port given with a name is ignored), such as the name of the Service operators
// reach it through. By default it answers only to requests whose Host is
// an IP address or a loopback name ("localhost", "*.localhost"): see
// Register for why. Each call adds to the names of the previous ones.
func AllowHosts(names ...string) Option {
	return func(p *Page) {
		if p.hosts == nil {
			p.hosts = map[string]bool{}
		}
		for _, n := range names {
			// A name given with its port ("orders.svc:8081") is the name:
			// the Host is compared without its port too.
			if h, _, err := net.SplitHostPort(n); err == nil {
				n = h
			}
			p.hosts[strings.ToLower(strings.TrimSuffix(n, "."))] = true
		}
	}
}

// New returns the status page of r.
func New(r Runner, opts ...Option) *Page {
	p := &Page{r: r, refresh: 5 * time.Second, timeout: 10 * time.Second, now: time.Now}
	for _, o := range opts {
		o(p)
	}
	return p
}

// Register adds the page's routes to mux: GET /tidemark (HTML), GET
// /tidemark.json, and POST /tidemark/pause and /tidemark/resume (403
// unless Controls is on).
//
// Every route answers 421 Misdirected Request to a Host that is not an IP
// address, a loopback name or a name of AllowHosts. That is the guard
// against DNS rebinding: a page at http://evil.example:8080 whose name is
// rebound to 127.0.0.1 is same-origin to itself, so a browser would send
// its requests to the page here with Host evil.example:8080 and let it
// read the answers (keys included) and POST the controls, which
// CrossOriginProtection lets through (Origin matches Host). A rebinding
// attack needs a DNS name the attacker controls; an IP literal or a
// loopback name cannot be rebound.
func (p *Page) Register(mux *http.ServeMux) {
	mux.Handle("GET /tidemark", p.checkHost(http.HandlerFunc(p.serveHTML)))
	mux.Handle("GET /tidemark.json", p.checkHost(http.HandlerFunc(p.serveJSON)))
	// CrossOriginProtection refuses a POST a browser sends from another
	// origin (Sec-Fetch-Site, or Origin against Host): with the Host
	// checked, a page elsewhere cannot pause a partition through an
	// operator's browser. GET never changes anything.
	cop := http.NewCrossOriginProtection()
	mux.Handle("POST /tidemark/pause", p.checkHost(cop.Handler(p.control(true))))
	mux.Handle("POST /tidemark/resume", p.checkHost(cop.Handler(p.control(false))))
}

// checkHost refuses a request whose Host the page does not answer to (see
// Register).
func (p *Page) checkHost(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if !p.hostAllowed(req.Host) {
			http.Error(w, fmt.Sprintf("status: host %q is not an IP address, a loopback name or one of status.AllowHosts", text(req.Host, 100)),
				http.StatusMisdirectedRequest)
			return
		}
		h.ServeHTTP(w, req)
	})
}

func (p *Page) hostAllowed(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.ToLower(strings.TrimSuffix(strings.TrimSuffix(strings.TrimPrefix(host, "["), "]"), "."))
	if host == "" {
		return false
	}
	if _, err := netip.ParseAddr(host); err == nil {
		return true
	}
	return host == "localhost" || strings.HasSuffix(host, ".localhost") || p.hosts[host]
}

// Handler returns a handler that serves the page's routes alone.
func (p *Page) Handler() http.Handler {
	mux := http.NewServeMux()
	p.Register(mux)
	return mux
}

// control serves a pause (or resume) request: form or query fields topic
// (required) and partition (optional: without it, the whole topic). It
// answers a browser's form with a redirect to the page (303), anyone else
// with the result in plain text.
func (p *Page) control(pause bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if !p.controls {
			http.Error(w, "status: controls are off (status.Controls; in the orders example -controls)", http.StatusForbidden)
			return
		}
		req.Body = http.MaxBytesReader(w, req.Body, 4<<10)
		if err := req.ParseForm(); err != nil {
			http.Error(w, "status: bad form: "+err.Error(), http.StatusBadRequest)
			return
		}
		topic, part := req.Form.Get("topic"), req.Form.Get("partition")
		if topic == "" {
			http.Error(w, "status: missing topic", http.StatusBadRequest)
			return
		}
		ctx, cancel := context.WithTimeout(req.Context(), p.timeout)
		defer cancel()
		var err error
		what := "topic " + strconv.Quote(topic)
		if part == "" {
			if pause {
				err = p.r.PauseTopics(ctx, topic)
			} else {
				err = p.r.ResumeTopics(ctx, topic)
			}
		} else {
			n, perr := strconv.ParseInt(part, 10, 32)
			if perr != nil || n < 0 {
				http.Error(w, fmt.Sprintf("status: partition %q: want a partition number", part), http.StatusBadRequest)
				return
			}
			tp := runner.TP{Topic: topic, Partition: int32(n)}
			what = "partition " + strconv.Quote(tp.String())
			if pause {
				err = p.r.PausePartitions(ctx, tp)
			} else {
				err = p.r.ResumePartitions(ctx, tp)
			}
		}
		if err != nil {
			code := http.StatusConflict
			switch {
			case errors.Is(err, runner.ErrNotHandled):
				code = http.StatusNotFound
			case errors.Is(err, runner.ErrStopped):
				code = http.StatusServiceUnavailable
			case errors.Is(err, context.DeadlineExceeded):
				code = http.StatusGatewayTimeout
			}
			http.Error(w, err.Error(), code)
			return
		}
		verb := "resumed"
		if pause {
			verb = "paused"
		}
		if req.Form.Get("from") == "page" {
			// Relative, so that the page works behind a proxy that
			// mounts it under a path prefix: from .../tidemark/pause back
			// to .../tidemark. (http.Redirect would make it absolute
			// from the path this server sees, without the prefix.)
			w.Header().Set("Location", "../tidemark")
			w.WriteHeader(http.StatusSeeOther)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, verb, what)
	})
}

func (p *Page) serveJSON(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(p.doc())
}

func (p *Page) serveHTML(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	// The page never needs a script: forbid them, in case escaping ever
	// misses one.
	w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'")
	if err := pageTmpl.Execute(w, p.doc()); err != nil {
		http.Error(w, "status: rendering the page: "+err.Error(), http.StatusInternalServerError)
	}
}

// Doc is the status document: the JSON of /tidemark.json and what the
// HTML page renders.
type Doc struct {
	GeneratedAt time.Time `json:"generated_at"`
	// LoopAt is when the runner last refreshed its stats.
	LoopAt   time.Time `json:"loop_at"`
	Stopping bool      `json:"stopping"`
	// Stopped: the runner's poll loop ended (Run returns or returned); it
	// owns no partition and is in no group.
	Stopped  bool   `json:"stopped"`
	InFlight int    `json:"in_flight"`
	Buffered int    `json:"buffered"`
	Bytes    int64  `json:"bytes"`
	Member   Member `json:"member"`
	// Controls says whether the pause and resume endpoints are on.
	Controls       bool           `json:"controls"`
	OperatorPaused OperatorPaused `json:"operator_paused"`
	Partitions     []Partition    `json:"partitions"`
	RefreshSeconds int            `json:"-"`
	KeysHidden     bool           `json:"keys_hidden"`
}

// Member is the process's group membership.
type Member struct {
	Group      string      `json:"group"`
	MemberID   string      `json:"member_id"`
	InstanceID string      `json:"instance_id,omitempty"`
	Generation int32       `json:"generation"`
	Joined     bool        `json:"joined"`
	ContactAt  *time.Time  `json:"contact_at"`
	ContactErr string      `json:"contact_error,omitempty"`
	Rebalances []Rebalance `json:"rebalances"`
}

// Rebalance is one rebalance report, newest first.
type Rebalance struct {
	At          time.Time `json:"at"`
	Kind        string    `json:"kind"`
	Generation  int32     `json:"generation"`
	TookSeconds float64   `json:"took_seconds"`
	Partitions  []string  `json:"partitions"`
}

// OperatorPaused is what an operator paused (runner.OperatorPauses).
type OperatorPaused struct {
	Topics     []string `json:"topics"`
	Partitions []string `json:"partitions"`
}

// Partition is one owned partition.
type Partition struct {
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	Epoch     uint64 `json:"epoch"`
	// Committed is the last commit the broker acknowledged (-1: none).
	Committed int64 `json:"committed"`
	// Safe is the offset the next commit will carry (-1: not known yet).
	Safe int64 `json:"safe"`
	// Fetched is the highest offset delivered to the runner (-1: none).
	Fetched       int64 `json:"fetched"`
	HighWatermark int64 `json:"high_watermark"`
	// Lag is HighWatermark − Committed; nil while either is unknown.
	Lag         *int64   `json:"lag"`
	Paused      bool     `json:"paused"`
	PausedBy    []string `json:"paused_by"`
	Queued      int      `json:"queued"` // fetched, not started
	InFlight    int      `json:"in_flight"`
	Bytes       int64    `json:"bytes"`
	Uncommitted int      `json:"uncommitted"`
	Lanes       int      `json:"lanes"`
	// DeadLettered and Fenced count since the partition was assigned here.
	DeadLettered int64   `json:"dead_lettered"`
	Fenced       int64   `json:"fenced"`
	Oldest       *Oldest `json:"oldest_unfinished"`
}

// Oldest is a partition's oldest unfinished record.
type Oldest struct {
	Offset int64 `json:"offset"`
	// Key is its key in printable form, clipped; "" for a nil key or
	// when keys are hidden.
	Key        string  `json:"key"`
	AgeSeconds float64 `json:"age_seconds"`
	State      string  `json:"state"`
	Attempts   int     `json:"attempts"`
	Error      string  `json:"error,omitempty"`
}

// errClip is how many bytes of a handler's error the page shows.
const errClip = 300

// text makes user bytes safe to show: valid UTF-8 (invalid bytes become
// U+FFFD), clipped to n bytes at a character boundary.
func text(s string, n int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) <= n {
		return s
	}
	for n > 0 && !isRuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

func isRuneStart(b byte) bool { return b&0xC0 != 0x80 }

func (p *Page) doc() Doc {
	s := p.r.Stats()
	op := p.r.OperatorPaused()
	d := Doc{
		GeneratedAt: p.now().UTC(), LoopAt: s.LoopAt, Stopping: s.Stopping, Stopped: s.Stopped, InFlight: s.InFlight,
		Buffered: s.Buffered, Bytes: s.Bytes, Controls: p.controls, KeysHidden: p.hideKeys,
		RefreshSeconds: int(p.refresh / time.Second),
		OperatorPaused: OperatorPaused{Topics: op.Topics, Partitions: []string{}},
		Partitions:     make([]Partition, 0, len(s.Partitions)),
	}
	if d.OperatorPaused.Topics == nil {
		d.OperatorPaused.Topics = []string{}
	}
	for _, tp := range op.Partitions {
		d.OperatorPaused.Partitions = append(d.OperatorPaused.Partitions, tp.String())
	}
	m := s.Member
	d.Member = Member{Group: m.Group, MemberID: m.MemberID, InstanceID: m.InstanceID, Generation: m.Generation,
		Joined: m.Joined, ContactErr: text(m.ContactErr, errClip), Rebalances: []Rebalance{}}
	if !m.ContactAt.IsZero() {
		at := m.ContactAt
		d.Member.ContactAt = &at
	}
	for i := len(m.Rebalances) - 1; i >= 0; i-- { // newest first
		rb := m.Rebalances[i]
		parts := make([]string, len(rb.Partitions))
		for j, tp := range rb.Partitions {
			parts[j] = tp.String()
		}
		d.Member.Rebalances = append(d.Member.Rebalances, Rebalance{At: rb.At, Kind: rb.Kind, Generation: rb.Generation,
			TookSeconds: rb.Took.Seconds(), Partitions: parts})
	}
	for _, ps := range s.Partitions {
		pp := Partition{
			Topic: ps.TP.Topic, Partition: ps.TP.Partition, Epoch: ps.Epoch, Committed: ps.Acknowledged, Safe: ps.Safe,
			Fetched: ps.Fetched, HighWatermark: ps.HighWatermark, Paused: ps.Paused, PausedBy: []string{},
			Queued: ps.Buffered - ps.InFlight, InFlight: ps.InFlight, Bytes: ps.Bytes, Uncommitted: ps.Outstanding,
			Lanes: ps.Lanes, DeadLettered: ps.DeadLettered, Fenced: ps.Fenced,
		}
		if ps.HighWatermark >= 0 && ps.Acknowledged >= 0 {
			lag := max(ps.HighWatermark-ps.Acknowledged, 0)
			pp.Lag = &lag
		}
		if c := ps.PausedBy.String(); c != "" {
			pp.PausedBy = strings.Split(c, ",")
		}
		if ps.OldestOffset >= 0 {
			o := &Oldest{Offset: ps.OldestOffset, AgeSeconds: ps.OldestAge.Seconds(), State: ps.OldestState.String(),
				Attempts: ps.OldestAttempts, Error: text(ps.OldestError, errClip)}
			if !p.hideKeys {
				o.Key = text(ps.OldestKey, 4*errClip)
			}
			pp.Oldest = o
		}
		d.Partitions = append(d.Partitions, pp)
	}
	slices.SortFunc(d.Partitions, func(a, b Partition) int {
		if c := strings.Compare(a.Topic, b.Topic); c != 0 {
			return c
		}
		return int(a.Partition) - int(b.Partition)
	})
	return d
}
