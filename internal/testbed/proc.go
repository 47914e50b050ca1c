package testbed

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"time"
)

// mark is what makes a process ours: two consecutive arguments of its
// command line, such as "kafka.Kafka" followed by our server.properties or
// "-D" followed by our data directory. A pid the kernel has since given to
// another process does not have them.
type mark [2]string

func (m mark) in(argv []string) bool {
	for i := 0; i+1 < len(argv); i++ {
		if argv[i] == m[0] && argv[i+1] == m[1] {
			return true
		}
	}
	return false
}

// cmdline returns pid's arguments; an error when there is no such process.
// A zombie has none.
func cmdline(pid int) ([]string, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return nil, err
	}
	b = bytes.TrimSuffix(b, []byte{0})
	if len(b) == 0 {
		return nil, nil
	}
	parts := bytes.Split(b, []byte{0})
	argv := make([]string, len(parts))
	for i, p := range parts {
		argv[i] = string(p)
	}
	return argv, nil
}

// ours reports whether pid is a live process whose command line carries m.
// The command line is read first: exited may reap a child of this process,
// and a pid that is not the bed's any more may be another child of ours (a
// chaos consumer) whose exit is its owner's to collect.
func ours(pid int, m mark) bool {
	if pid <= 1 {
		return false
	}
	argv, err := cmdline(pid)
	return err == nil && m.in(argv) && !exited(pid)
}

// exited reports whether pid has exited. A child of this process (one Start
// launched here, as in the chaos suite) is reaped; a zombie that is not our
// child counts as exited, since only its parent can reap it.
func exited(pid int) bool {
	var ws syscall.WaitStatus
	wpid, err := syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
	switch {
	case err == nil && wpid == pid:
		return true // our child, reaped now
	case err == nil && wpid == 0:
		return false // our child, running
	}
	// Not our child (ECHILD): ask /proc.
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	// pid (comm) S ...: the state follows the last ')', as comm may hold one.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return true
	}
	s := b[i+2]
	return s == 'Z' || s == 'X'
}

// pgid returns pid's process group, -1 when it cannot be read.
func pgid(pid int) int {
	g, err := syscall.Getpgid(pid)
	if err != nil {
		return -1
	}
	return g
}

// stopProcess sends sig to pid, which must be ours by m, and waits up to
// timeout for it to exit; then, unless sig was SIGKILL already, it sends
// SIGKILL — to the process group when pid leads one (everything the bed
// starts does), else to pid — and waits 10 s more. It reports whether that
// SIGKILL was needed. A pid that is not ours (any more) is left alone:
// nothing is signalled.
func stopProcess(pid int, m mark, sig syscall.Signal, timeout time.Duration) (killed bool, err error) {
	if !ours(pid, m) {
		return false, nil
	}
	if err := syscall.Kill(pid, sig); err != nil {
		if errors.Is(err, syscall.ESRCH) {
			return false, nil
		}
		return false, fmt.Errorf("signal %s to pid %d: %w", sig, pid, err)
	}
	if waitExit(pid, timeout) {
		return false, nil
	}
	if sig == syscall.SIGKILL {
		return false, fmt.Errorf("pid %d did not exit within %s of SIGKILL", pid, timeout)
	}
	// Checked again: in timeout the process may have exited and its pid
	// been reused.
	if !ours(pid, m) {
		return false, nil
	}
	target := pid
	if pgid(pid) == pid {
		target = -pid
	}
	if err := syscall.Kill(target, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return true, fmt.Errorf("SIGKILL to pid %d: %w", target, err)
	}
	if !waitExit(pid, 10*time.Second) {
		return true, fmt.Errorf("pid %d did not exit within 10s of SIGKILL", pid)
	}
	return true, nil
}

// waitExit polls until pid has exited or within has passed.
func waitExit(pid int, within time.Duration) bool {
	deadline := time.Now().Add(within)
	for {
		if exited(pid) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// startDetached starts argv[0] with argv[1:] in dir, in a session and so a
// process group of its own, with stdin from /dev/null and stdout and
// stderr appended to out, as cred when cred is not nil. It does not wait:
// the process outlives the caller.
//
// Setsid rather than only Setpgid, as the bash bed's setsid did: besides
// the group of its own (a Ctrl-C in the caller's terminal, or make's
// shell ending, does not reach the server), the server has no controlling
// terminal, and its group never counts as orphaned within the caller's
// session — which would get a server stopped with SIGSTOP (the chaos
// suite's pauses) a SIGHUP when the caller exits.
func startDetached(argv []string, dir, out string, cred *syscall.Credential) (int, error) {
	f, err := os.OpenFile(out, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = dir
	// *os.File, not a writer: the child gets the descriptor itself, and no
	// goroutine of ours copies its output.
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Credential: cred}
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	pid := cmd.Process.Pid
	// Drop os.Process's handle; exited reaps the child by pid, and nothing
	// calls cmd.Wait.
	_ = cmd.Process.Release()
	return pid, nil
}

// runLogged runs argv to completion, as cred when not nil, with its output
// written to out, bounded by ctx.
func runLogged(ctx context.Context, argv []string, out string, cred *syscall.Credential) error {
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	defer f.Close()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: cred}
	return cmd.Run()
}

// portFree returns an error when something holds 127.0.0.1:port, so a
// server could not listen there.
func portFree(port int) error {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	if c, err := net.DialTimeout("tcp", addr, 500*time.Millisecond); err == nil {
		c.Close()
		return fmt.Errorf("port %s is in use by another process", addr)
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("port %s cannot be listened on: %w", addr, err)
	}
	return l.Close()
}

// waitPortsFree waits up to within for the ports to be free (the sockets of
// a server that just stopped may take a moment to close) and returns the
// last error.
func waitPortsFree(within time.Duration, ps ...int) error {
	deadline := time.Now().Add(within)
	for {
		var err error
		for _, p := range ps {
			if err = portFree(p); err != nil {
				break
			}
		}
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// tail returns the last n lines of the file at path, framed for an error
// message; "" when it cannot be read.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil || len(b) == 0 {
		return ""
	}
	lines := bytes.Split(bytes.TrimRight(b, "\n"), []byte{'\n'})
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return fmt.Sprintf("--- last lines of %s ---\n%s\n---", path, bytes.Join(lines, []byte{'\n'}))
}

func isExecutable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0
}
