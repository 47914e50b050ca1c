package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// events builds a `go test -json` stream, one event per argument:
// "Action Package Test Elapsed Output" with fields split on |.
func events(t *testing.T, lines ...string) string {
	t.Helper()
	var b strings.Builder
	for _, l := range lines {
		f := strings.Split(l, "|")
		if len(f) != 5 {
			t.Fatalf("event %q: want 5 fields", l)
		}
		key := `"Package"`
		if strings.HasPrefix(f[0], "build-") {
			key = `"ImportPath"`
		}
		b.WriteString(`{"Action":"` + f[0] + `",` + key + `:"` + f[1] + `","Test":"` + f[2] + `","Elapsed":` + f[3] + `,"Output":"` + f[4] + `"}` + "\n")
	}
	return b.String()
}

func TestSaveAndPrint(t *testing.T) {
	cases := []struct {
		name    string
		in      string
		verbose bool
		want    string
		failed  bool
	}{
		{
			name: "a pass prints its package line only",
			in: events(t, "run|p|TestA|0|", "output|p|TestA|0|=== RUN TestA\\n", "output|p|TestA|0|    a_test.go:1: hello\\n",
				"pass|p|TestA|0.5|", "output|p||0|PASS\\n", "output|p||0|ok  \\tp\\t0.6s\\n", "pass|p||0.6|"),
			want: "ok  \tp\t0.6s\n",
		},
		{
			name: "verbose prints a passing test's output",
			in: events(t, "output|p|TestA|0|    a_test.go:1: hello\\n", "pass|p|TestA|0.5|",
				"output|p||0|ok  \\tp\\t0.6s\\n", "pass|p||0.6|"),
			verbose: true,
			want:    "    a_test.go:1: hello\nok  \tp\t0.6s\n",
		},
		{
			name: "a failed test prints its output, not its passing neighbour's",
			in: events(t, "output|p|TestA|0|quiet\\n", "pass|p|TestA|0|", "output|p|TestB|0|    b_test.go:3: boom\\n",
				"output|p|TestB|0|--- FAIL: TestB (0.00s)\\n", "fail|p|TestB|0|", "output|p||0|FAIL\\tp\\t0.1s\\n", "fail|p||0.1|"),
			want:   "    b_test.go:3: boom\n--- FAIL: TestB (0.00s)\nFAIL\tp\t0.1s\n",
			failed: true,
		},
		{
			name: "a test that never finished is printed with its package's failure",
			in: events(t, "output|p|TestHang|0|    h_test.go:9: waiting\\n", "output|p||0|panic: test timed out after 1m0s\\n",
				"output|p||0|FAIL\\tp\\t60.0s\\n", "fail|p||60|"),
			want:   "=== TestHang did not finish; its output:\n    h_test.go:9: waiting\npanic: test timed out after 1m0s\nFAIL\tp\t60.0s\n",
			failed: true,
		},
		{
			name: "a skip is shown with its reason",
			in: events(t, "output|p|TestS|0|    s_test.go:2: no broker\\n", "output|p|TestS|0|--- SKIP: TestS (0.00s)\\n",
				"skip|p|TestS|0|", "output|p||0|ok  \\tp\\t0.1s\\n", "pass|p||0.1|"),
			want: "SKIP p TestS: s_test.go:2: no broker\nok  \tp\t0.1s\n",
		},
		{
			name: "a build failure prints the compiler's output",
			in: events(t, "build-output|p [p.test]|| 0|# p [p.test]\\n", "build-output|p [p.test]||0|./a_test.go:3:2: declared and not used: x\\n",
				"build-fail|p [p.test]||0|", "output|p||0|FAIL\\tp [build failed]\\n", "fail|p||0|"),
			want:   "# p [p.test]\n./a_test.go:3:2: declared and not used: x\nFAIL\tp [build failed]\n",
			failed: true,
		},
		{
			name: "a package where -run matched no test fails",
			in: events(t, "output|p||0|testing: warning: no tests to run\\n", "output|p||0|ok  \\tp\\t0.1s [no tests to run]\\n",
				"pass|p||0.1|"),
			want:   "ok  \tp\t0.1s [no tests to run]\nFAIL\tp: no test ran; the phase's -run names no test of the package\n",
			failed: true,
		},
		{
			name: "a line that is not an event is printed as it is",
			in:   "go: warning: \"./nothing/...\" matched no packages\n",
			want: "go: warning: \"./nothing/...\" matched no packages\n",
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			save := filepath.Join(t.TempDir(), "events.json")
			var out strings.Builder
			failed, err := saveAndPrint(strings.NewReader(c.in), &out, save, c.verbose)
			if err != nil {
				t.Fatal(err)
			}
			if out.String() != c.want || failed != c.failed {
				t.Errorf("printed\n%q, failed %v\nwant\n%q, failed %v", out.String(), failed, c.want, c.failed)
			}
			if b, err := os.ReadFile(save); err != nil || string(b) != c.in {
				t.Errorf("saved %q, %v; want the input as it came", b, err)
			}
		})
	}
}

func TestSlowest(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.json"), filepath.Join(dir, "b.json")
	if err := os.WriteFile(a, []byte(events(t, "pass|x/p|TestQuick|0.2|", "pass|x/p|TestSlow|9.5|",
		"pass|x/p|TestSlow/sub|9.4|", "pass|x/p||10|")), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(b, []byte(events(t, "fail|x/q|TestFailedSlowly|20|", "skip|x/q|TestSkipped|30|")), 0o644); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if err := printSlowest(&out, 2, []string{a, b}); err != nil {
		t.Fatal(err)
	}
	want := "   20.0s  q              TestFailedSlowly\n    9.5s  p              TestSlow\n"
	if out.String() != want {
		t.Errorf("slowest 2:\n%s\nwant\n%s", out.String(), want)
	}
	if err := printSlowest(&out, 2, []string{filepath.Join(dir, "missing.json")}); err == nil {
		t.Error("a missing file was not an error")
	}
	empty := filepath.Join(dir, "empty.json")
	if err := os.WriteFile(empty, []byte("not an event\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := printSlowest(&out, 2, []string{empty}); err == nil || !strings.Contains(err.Error(), "no test results") {
		t.Errorf("a file without results: err %v, want one that says so", err)
	}
}
