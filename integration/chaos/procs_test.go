//go:build integration

package chaos_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tidemark/tidemark/internal/promtext"
	"github.com/tidemark/tidemark/internal/tcpproxy"
)

// consumer is one process of the orders service.
type consumer struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{} // closed when the process has exited and been reaped

	// With fleet.network: its own proxies, one per broker address (the
	// -kafka-dial map) and one to PostgreSQL (its -dsn), closed when it
	// exits.
	kafka []*tcpproxy.Proxy
	pg    *tcpproxy.Proxy

	mu       sync.Mutex
	signaled bool   // we sent it SIGKILL or SIGTERM: its exit is expected
	paused   bool   // SIGSTOPped and not yet SIGCONTed
	faulted  bool   // a network fault is on its proxies
	http     string // its probe and metrics address, from its log
}

// exited reports whether the process has exited.
func (c *consumer) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

func (c *consumer) isPaused() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.paused
}

// isFaulted reports whether a network fault is on c's proxies.
func (c *consumer) isFaulted() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.faulted
}

func (c *consumer) setFaulted(on bool) {
	c.mu.Lock()
	c.faulted = on
	c.mu.Unlock()
}

// closeProxies closes c's proxies (none without fleet.network).
func (c *consumer) closeProxies() {
	for _, p := range c.kafka {
		p.Close()
	}
	if c.pg != nil {
		c.pg.Close()
	}
}

// metric returns the sum of the Prometheus samples named name (every
// label set) on c's /metrics, found at the address its log names.
func (c *consumer) metric(ctx context.Context, name string) (float64, error) {
	addr, err := c.httpAddr()
	for deadline := time.Now().Add(10 * time.Second); err != nil && time.Now().Before(deadline); {
		// Just started: it logs the address once it serves.
		if !sleep(ctx, 200*time.Millisecond) {
			break
		}
		addr, err = c.httpAddr()
	}
	if err != nil {
		return 0, err
	}
	m, err := promtext.Scrape(ctx, addr)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", c.name, err)
	}
	return m[name], nil
}

// httpAddr is the address c serves /metrics on: -http 127.0.0.1:0 picks a
// port, which the service logs.
func (c *consumer) httpAddr() (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.http != "" {
		return c.http, nil
	}
	f, err := os.Open(c.log)
	if err != nil {
		return "", err
	}
	defer f.Close()
	dec := json.NewDecoder(f)
	for {
		var line struct {
			Msg  string `json:"msg"`
			Addr string `json:"addr"`
		}
		if err := dec.Decode(&line); err == io.EOF {
			return "", fmt.Errorf("%s: its log %s names no metrics address yet", c.name, c.log)
		} else if err != nil {
			return "", fmt.Errorf("%s: reading its log %s: %w", c.name, c.log, err)
		}
		if strings.HasPrefix(line.Msg, "serving probes") && line.Addr != "" {
			c.http = line.Addr
			return c.http, nil
		}
	}
}

// fleet is the set of consumer processes of one run.
type fleet struct {
	t      *testing.T
	bin    string
	args   []string
	env    []string
	logDir string

	// Set by network: each consumer's connections go through proxies.
	kafkaTargets []string // the broker addresses a client dials: seeds and advertised
	dsn          string
	down         map[string]bool // targets whose broker the bed stopped (see targetsDown)
	commits      commitWatch     // the OffsetCommit answers on every consumer's broker connections

	mu    sync.Mutex
	all   []*consumer
	next  int
	wg    sync.WaitGroup // the reapers
	unexp []string       // consumers that exited without being told to
}

// network makes every consumer started from now on connect through
// proxies of its own: one per address of kafkaTargets (the brokers' seed
// and advertised addresses; the consumer gets -kafka-dial mapping each to
// its proxy, and dials no other) and one to dsn's server (its
// TIDEMARK_PG_DSN names the proxy). The fleet's args must not hold -dsn.
func (f *fleet) network(kafkaTargets []string, dsn string) error {
	u, err := url.Parse(dsn)
	if err != nil || u.Host == "" {
		// Not err: a url.Error quotes the whole DSN, password and all.
		return errors.New("the chaos suite proxies the database connection of each consumer and needs TIDEMARK_PG_DSN as a URL with host:port (postgres://…)")
	}
	f.kafkaTargets = append([]string(nil), kafkaTargets...)
	sort.Strings(f.kafkaTargets)
	f.dsn = dsn
	return nil
}

// proxies starts c's proxies and returns the arguments and the
// environment that send its connections through them.
func (f *fleet) proxies(c *consumer) (args, env []string, err error) {
	if f.dsn == "" {
		return nil, nil, nil
	}
	var dial []string
	for _, target := range f.kafkaTargets {
		p, err := tcpproxy.New(target)
		if err != nil {
			c.closeProxies()
			return nil, nil, err
		}
		p.WrapTarget(f.commits.wrap)
		f.mu.Lock()
		if f.down[target] {
			p.Cut()
		}
		f.mu.Unlock()
		c.kafka = append(c.kafka, p)
		dial = append(dial, target+"="+p.Addr())
	}
	u, _ := url.Parse(f.dsn) // checked by network
	p, err := tcpproxy.New(u.Host)
	if err != nil {
		c.closeProxies()
		return nil, nil, err
	}
	c.pg = p
	u.Host = p.Addr()
	// The DSN in the environment (TIDEMARK_PG_DSN, after the bed's in
	// os.Environ: the last one counts), not in argv, which every user of
	// the machine can read.
	return []string{"-kafka-dial", strings.Join(dial, ",")}, []string{"TIDEMARK_PG_DSN=" + u.String()}, nil
}

// targetsDown makes every consumer's proxies of the targets refuse
// connections (tcpproxy.Cut), as the stopped broker behind them does: a
// proxy in front of a dead broker would otherwise accept each dial and then
// close it when its own dial fails, and a client would see a connection
// that ends, not the refused dial it sees from a dead broker (franz-go
// forgets a cached coordinator only on a failed dial). The bed's verbs
// call it once the broker stopped, targetsUp once it is started again.
func (f *fleet) targetsDown(targets []string) {
	f.mu.Lock()
	if f.down == nil {
		f.down = map[string]bool{}
	}
	for _, a := range targets {
		f.down[a] = true
	}
	cs := slices.Clone(f.all)
	f.mu.Unlock()
	for _, c := range cs {
		for _, p := range c.kafka {
			if slices.Contains(targets, p.Target()) {
				p.Cut()
			}
		}
	}
}

// targetsUp undoes targetsDown for the targets.
func (f *fleet) targetsUp(targets []string) error {
	f.mu.Lock()
	for _, a := range targets {
		delete(f.down, a)
	}
	cs := slices.Clone(f.all)
	f.mu.Unlock()
	var errs []error
	for _, c := range cs {
		if c.exited() {
			continue
		}
		for _, p := range c.kafka {
			if slices.Contains(targets, p.Target()) {
				if err := p.Restore(); err != nil && !errors.Is(err, tcpproxy.ErrClosed) { // an exited one's proxies are closed
					errs = append(errs, fmt.Errorf("%s: %w", c.name, err))
				}
			}
		}
	}
	return errors.Join(errs...)
}

func newFleet(t *testing.T, bin, logDir string, args, env []string) *fleet {
	// The strict effect, whose applications check counts (check_test.go);
	// first, so that env can override it.
	env = append([]string{"ORDERS_EFFECT=strict"}, env...)
	f := &fleet{t: t, bin: bin, args: args, env: env, logDir: logDir}
	// Registered after the bed's cleanups, so it runs before them: no
	// consumer survives the test, and none is left writing while the topic
	// and schema are dropped.
	t.Cleanup(f.killAll)
	return f
}

// start launches a new consumer and returns it.
func (f *fleet) start() (*consumer, error) {
	f.mu.Lock()
	f.next++
	name := fmt.Sprintf("c%02d", f.next)
	f.mu.Unlock()
	logPath := filepath.Join(f.logDir, name+".log")
	out, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	c := &consumer{name: name, log: logPath, done: make(chan struct{})}
	netArgs, netEnv, err := f.proxies(c)
	if err != nil {
		out.Close()
		return nil, fmt.Errorf("proxies of %s: %w", name, err)
	}
	cmd := exec.Command(f.bin, append(append([]string(nil), f.args...), netArgs...)...)
	cmd.Env = slices.Concat(os.Environ(), f.env, netEnv)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		out.Close()
		c.closeProxies()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	c.cmd = cmd
	f.mu.Lock()
	f.all = append(f.all, c)
	f.mu.Unlock()
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		_ = cmd.Wait()
		out.Close()
		c.closeProxies()
		c.mu.Lock()
		expected := c.signaled
		c.mu.Unlock()
		if !expected {
			f.mu.Lock()
			f.unexp = append(f.unexp, fmt.Sprintf("%s exited on its own: %s (log %s)", c.name, cmd.ProcessState, c.log))
			f.mu.Unlock()
		}
		close(c.done)
	}()
	return c, nil
}

// running returns the consumers that have not exited; with active, only
// those that are neither paused nor under a network fault.
func (f *fleet) running(active bool) []*consumer {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*consumer
	for _, c := range f.all {
		if !c.exited() && (!active || !c.isPaused() && !c.isFaulted()) {
			out = append(out, c)
		}
	}
	return out
}

// signal sends sig to c and marks its exit as expected for SIGKILL and
// SIGTERM.
func (f *fleet) signal(c *consumer, sig syscall.Signal) error {
	c.mu.Lock()
	switch sig {
	case syscall.SIGKILL, syscall.SIGTERM:
		c.signaled = true
	case syscall.SIGSTOP:
		c.paused = true
	case syscall.SIGCONT:
		c.paused = false
	}
	c.mu.Unlock()
	if err := c.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("%s: %s: %w", c.name, sig, err)
	}
	return nil
}

// stop sends SIGTERM and waits up to within for the exit; it returns the
// exit status.
func (f *fleet) stop(c *consumer, within time.Duration) (int, error) {
	if err := f.signal(c, syscall.SIGTERM); err != nil {
		return -1, err
	}
	select {
	case <-c.done:
		return c.cmd.ProcessState.ExitCode(), nil
	case <-time.After(within):
		return -1, fmt.Errorf("%s did not exit within %s of SIGTERM (log %s)", c.name, within, c.log)
	}
}

// unexpected returns what exited without being told to.
func (f *fleet) unexpected() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.unexp...)
}

func (f *fleet) started() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.all)
}

// killAll kills every consumer still running (a paused one is continued
// first so it can die) and waits for the reapers.
func (f *fleet) killAll() {
	f.mu.Lock()
	all := append([]*consumer(nil), f.all...)
	f.mu.Unlock()
	for _, c := range all {
		if c.exited() {
			continue
		}
		c.mu.Lock()
		c.signaled = true
		c.mu.Unlock()
		_ = c.cmd.Process.Signal(syscall.SIGCONT)
		_ = c.cmd.Process.Kill()
	}
	f.wg.Wait()
}
