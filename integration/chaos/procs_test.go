//go:build integration

package chaos_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
)

// consumer is one process of the orders service.
type consumer struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{} // closed when the process has exited and been reaped

	mu       sync.Mutex
	signaled bool // we sent it SIGKILL or SIGTERM: its exit is expected
	paused   bool // SIGSTOPped and not yet SIGCONTed
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

// fleet is the set of consumer processes of one run.
type fleet struct {
	t      *testing.T
	bin    string
	args   []string
	env    []string
	logDir string

	mu    sync.Mutex
	all   []*consumer
	next  int
	wg    sync.WaitGroup // the reapers
	unexp []string       // consumers that exited without being told to
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
	cmd := exec.Command(f.bin, f.args...)
	cmd.Env = append(os.Environ(), f.env...)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		out.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	c := &consumer{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	f.mu.Lock()
	f.all = append(f.all, c)
	f.mu.Unlock()
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		_ = cmd.Wait()
		out.Close()
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
// those that are not paused either.
func (f *fleet) running(active bool) []*consumer {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*consumer
	for _, c := range f.all {
		if !c.exited() && (!active || !c.isPaused()) {
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
