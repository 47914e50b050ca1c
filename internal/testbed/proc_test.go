package testbed_test

import (
	"bufio"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tidemark/tidemark/internal/testbed"
)

// fakeServer starts sh, in a process group of its own as the bed's
// servers are, with argv after its script so that its command line carries
// a mark. It writes the first of SIGTERM, SIGINT and SIGQUIT it gets to
// sigfile and exits 0 — or, with ignoreTerm, ignores SIGTERM. It returns
// once the traps are set (the script says so on a pipe), so a signal sent
// afterwards is never the default action's.
func fakeServer(t *testing.T, sigfile string, ignoreTerm bool, argv ...string) int {
	t.Helper()
	script := `for s in TERM INT QUIT; do trap "echo $s > \"\$SIGFILE\"; exit 0" $s; done; echo ready; while :; do sleep 0.05; done`
	if ignoreTerm {
		script = `trap '' TERM; echo ready; while :; do sleep 0.05; done`
	}
	return startSh(t, script, []string{"SIGFILE=" + sigfile}, argv...)
}

// startSh starts sh -c script with argv after the script and env added to
// the environment, in a process group of its own, and returns once the
// script has written "ready" on its stdout. It is SIGKILLed, as a group, at
// the test's end.
func startSh(t *testing.T, script string, env []string, argv ...string) int {
	t.Helper()
	cmd := exec.Command("sh", append([]string{"-c", script}, argv...)...)
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	// Reaped by testbed.Exited, as the bed reaps a server it started.
	_ = cmd.Process.Release()
	t.Cleanup(func() {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		waitGone(t, pid)
		out.Close()
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "ready\n" {
		t.Fatalf("fake server: read %q, %v", line, err)
	}
	return pid
}

// waitGone waits up to 10 s for pid to exit (reaping it).
func waitGone(t *testing.T, pid int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !testbed.Exited(pid); {
		if time.Now().After(deadline) {
			t.Fatalf("pid %d did not exit within 10s", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func readSig(t *testing.T, f string) string {
	t.Helper()
	b, err := os.ReadFile(f)
	if os.IsNotExist(err) {
		return ""
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func TestMark(t *testing.T) {
	m := testbed.Mark{"kafka.Kafka", "/bed/kafka/node-1/server.properties"}
	for _, c := range []struct {
		argv []string
		want bool
	}{
		{[]string{"java", "-cp", "x", "kafka.Kafka", "/bed/kafka/node-1/server.properties"}, true},
		{[]string{"java", "kafka.Kafka", "/other/server.properties"}, false},
		{[]string{"java", "/bed/kafka/node-1/server.properties", "kafka.Kafka"}, false},
		{[]string{"java", "kafka.Kafka /bed/kafka/node-1/server.properties"}, false}, // one argument is not two
		{[]string{"kafka.Kafka"}, false},
		{nil, false},
	} {
		if got := m.In(c.argv); got != c.want {
			t.Errorf("%q: In = %v, want %v", c.argv, got, c.want)
		}
	}
}

func TestOurs(t *testing.T) {
	props := filepath.Join(t.TempDir(), "server.properties")
	pid := fakeServer(t, filepath.Join(t.TempDir(), "sig"), false, "kafka.Kafka", props)
	if !testbed.Ours(pid, testbed.Mark{"kafka.Kafka", props}) {
		t.Fatal("Ours = false for the process with our mark")
	}
	for _, m := range []testbed.Mark{{"kafka.Kafka", props + "x"}, {props, "kafka.Kafka"}, {"-D", props}} {
		if testbed.Ours(pid, m) {
			t.Errorf("Ours(%v) = true for a process without that mark", m)
		}
	}
	for _, p := range []int{0, 1, -pid} {
		if testbed.Ours(p, testbed.Mark{"kafka.Kafka", props}) {
			t.Errorf("Ours(%d) = true", p)
		}
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitGone(t, pid)
	if testbed.Ours(pid, testbed.Mark{"kafka.Kafka", props}) {
		t.Fatal("Ours = true for a process that exited")
	}
}

// TestStopProcess: the signal asked for is what the process gets; one that
// ignores it gets SIGKILL after the timeout; one that is not ours gets
// nothing.
func TestStopProcess(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGQUIT} {
		t.Run(sig.String(), func(t *testing.T) {
			sigfile := filepath.Join(t.TempDir(), "sig")
			m := testbed.Mark{"-D", t.TempDir()}
			pid := fakeServer(t, sigfile, false, m[0], m[1])
			killed, err := testbed.StopProcess(pid, m, sig, 10*time.Second)
			if err != nil || killed {
				t.Fatalf("StopProcess = %v, %v; want no SIGKILL, no error", killed, err)
			}
			if !testbed.Exited(pid) {
				t.Fatal("the process runs after StopProcess returned")
			}
			want := map[syscall.Signal]string{syscall.SIGTERM: "TERM", syscall.SIGINT: "INT", syscall.SIGQUIT: "QUIT"}[sig]
			if got := readSig(t, sigfile); got != want {
				t.Fatalf("the process got %q, want %q", got, want)
			}
		})
	}

	t.Run("escalates", func(t *testing.T) {
		m := testbed.Mark{"kafka.Kafka", filepath.Join(t.TempDir(), "server.properties")}
		pid := fakeServer(t, filepath.Join(t.TempDir(), "sig"), true, m[0], m[1])
		start := time.Now()
		killed, err := testbed.StopProcess(pid, m, syscall.SIGTERM, 300*time.Millisecond)
		if err != nil || !killed {
			t.Fatalf("StopProcess = %v, %v; want SIGKILL sent, no error", killed, err)
		}
		if took := time.Since(start); took < 300*time.Millisecond {
			t.Fatalf("SIGKILL after %s, before the 300ms timeout", took)
		}
		if !testbed.Exited(pid) {
			t.Fatal("the process runs after SIGKILL")
		}
	})

	t.Run("not ours", func(t *testing.T) {
		sigfile := filepath.Join(t.TempDir(), "sig")
		m := testbed.Mark{"-D", t.TempDir()}
		pid := fakeServer(t, sigfile, false, m[0], m[1])
		killed, err := testbed.StopProcess(pid, testbed.Mark{"-D", "/somebody/else"}, syscall.SIGTERM, time.Second)
		if err != nil || killed {
			t.Fatalf("StopProcess = %v, %v", killed, err)
		}
		if !testbed.Ours(pid, m) || readSig(t, sigfile) != "" {
			t.Fatal("a process without our mark was signalled")
		}
	})
}

func TestStartDetached(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "out.log")
	// stdin is /dev/null (read fails), stdout and stderr go to out, and a
	// second start appends.
	for range 2 {
		pid, err := testbed.StartDetached([]string{"sh", "-c", `echo out; echo err >&2; pwd; read x || echo eof`}, dir, out, nil)
		if err != nil {
			t.Fatal(err)
		}
		waitGone(t, pid)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	one := "out\nerr\n" + dir + "\neof\n"
	if string(b) != one+one {
		t.Fatalf("out.log = %q, want %q twice", b, one)
	}

	// Its own session and process group, led by it.
	pid, err := testbed.StartDetached([]string{"sleep", "30"}, dir, out, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL); waitGone(t, pid) })
	g, err := syscall.Getpgid(pid)
	if err != nil {
		t.Fatal(err)
	}
	if g != pid || g == syscall.Getpgrp() {
		t.Fatalf("child pid %d has process group %d (ours %d), want its own", pid, g, syscall.Getpgrp())
	}
	sid, _, errno := syscall.RawSyscall(syscall.SYS_GETSID, uintptr(pid), 0, 0)
	if errno != 0 || int(sid) != pid {
		t.Fatalf("child pid %d is in session %d (%v), want its own", pid, sid, errno)
	}
}

func TestPortFree(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	if err := testbed.PortFree(port); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("PortFree of a listened port = %v", err)
	}
	l.Close()
	if err := testbed.PortFree(port); err != nil {
		t.Fatalf("PortFree after close = %v", err)
	}
}
