package lab_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/tidemark/tidemark/cmd/tidemark/internal/lab"
)

// offsets runs the command and returns its exit status, stdout and stderr.
func offsets(t *testing.T, stdin string, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := lab.Offsets(args, strings.NewReader(stdin), &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestJSONNormalNaive(t *testing.T) {
	code, out, stderr := offsets(t, "", "--case", "normal", "--strategy", "naive", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	want := `{
  "strategy": "naive",
  "steps": [
    {"line": 4, "op": "assign", "epoch": 1, "start": 100, "safe": 100},
    {"line": 5, "op": "deliver", "offsets": [100, 103, 108], "safe": 100},
    {"line": 6, "op": "complete", "offset": 108, "epoch": 1, "outcome": "recorded", "safe": 100},
    {"line": 7, "op": "complete", "offset": 100, "epoch": 1, "outcome": "advanced", "safe": 101},
    {"line": 8, "op": "complete", "offset": 103, "epoch": 1, "outcome": "advanced", "safe": 109}
  ],
  "safe": 109,
  "violations": [
    {"line": 6, "unsafe_offset": 109, "skipped": [100, 103]},
    {"line": 7, "unsafe_offset": 109, "skipped": [103]}
  ]
}`
	sameJSON(t, out, want)
}

func TestJSONAllOps(t *testing.T) {
	script := `# every op
assign 1 100
deliver 100 101
complete 100
position 105     # 101 is outstanding
complete 101
position 105
revoke
assign 2 105
lost
complete 105 2
`
	code, out, stderr := offsets(t, script, "--script", "-", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	want := `{
  "strategy": "prefix",
  "steps": [
    {"line": 2, "op": "assign", "epoch": 1, "start": 100, "safe": 100},
    {"line": 3, "op": "deliver", "offsets": [100, 101], "safe": 100},
    {"line": 4, "op": "complete", "offset": 100, "epoch": 1, "outcome": "advanced", "safe": 101},
    {"line": 5, "op": "position", "position": 105, "outcome": "unchanged", "safe": 101},
    {"line": 6, "op": "complete", "offset": 101, "epoch": 1, "outcome": "advanced", "safe": 102},
    {"line": 7, "op": "position", "position": 105, "outcome": "advanced", "safe": 105},
    {"line": 8, "op": "revoke", "commit": 105, "safe": 105},
    {"line": 9, "op": "assign", "epoch": 2, "start": 105, "safe": 105},
    {"line": 10, "op": "lost", "commit": null, "safe": 105},
    {"line": 11, "op": "complete", "offset": 105, "epoch": 2, "outcome": "not-owner", "safe": 105}
  ],
  "safe": 105,
  "violations": []
}`
	sameJSON(t, out, want)
}

func TestJSONBeforeAssign(t *testing.T) {
	code, out, _ := offsets(t, "complete 5\nlost\nposition 3\n", "--script", "-", "--json")
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	sameJSON(t, out, `{"strategy": "prefix", "steps": [
		{"line": 1, "op": "complete", "offset": 5, "epoch": 0, "outcome": "not-owner", "safe": null},
		{"line": 2, "op": "lost", "commit": null, "safe": null},
		{"line": 3, "op": "position", "position": 3, "outcome": "unchanged", "safe": null}
	], "safe": null, "violations": []}`)
	code, out, _ = offsets(t, "# nothing\n\n", "--script", "-", "--json")
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	sameJSON(t, out, `{"strategy": "prefix", "steps": [], "safe": null, "violations": []}`)
}

func sameJSON(t *testing.T, got, want string) {
	t.Helper()
	var g, w any
	if err := json.Unmarshal([]byte(got), &g); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, got)
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatalf("bad want: %v", err)
	}
	if !reflect.DeepEqual(g, w) {
		t.Fatalf("got\n%s\nwant\n%s", got, want)
	}
}

// TestCaseTraces checks the seed's expected traces for both strategies.
func TestCaseTraces(t *testing.T) {
	tests := []struct {
		name       string
		strategy   string
		outcomes   []string // outcome of each complete step
		safes      []int64  // safe after each complete step
		violations []lab.Violation
	}{
		{"normal", "prefix", []string{"recorded", "advanced", "advanced"}, []int64{100, 101, 109}, nil},
		{"normal", "naive", []string{"recorded", "advanced", "advanced"}, []int64{100, 101, 109}, []lab.Violation{
			{Line: 6, UnsafeOffset: 109, Skipped: []int64{100, 103}},
			{Line: 7, UnsafeOffset: 109, Skipped: []int64{103}},
		}},
		{"stale", "prefix", []string{"old-assignment", "old-assignment", "old-assignment"}, []int64{100, 100, 100}, nil},
		{"stale", "naive", []string{"old-assignment", "old-assignment", "old-assignment"}, []int64{100, 100, 100}, []lab.Violation{
			{Line: 9, UnsafeOffset: 109, Skipped: []int64{100, 103, 108}},
			{Line: 10, UnsafeOffset: 109, Skipped: []int64{100, 103, 108}},
			{Line: 11, UnsafeOffset: 109, Skipped: []int64{100, 103, 108}},
		}},
		{"handoff", "prefix",
			[]string{"advanced", "not-owner", "old-assignment", "recorded", "advanced", "duplicate"},
			[]int64{101, 101, 101, 101, 109, 109}, nil},
		{"handoff", "naive",
			[]string{"advanced", "not-owner", "old-assignment", "recorded", "advanced", "duplicate"},
			[]int64{101, 101, 101, 101, 109, 109}, []lab.Violation{
				{Line: 9, UnsafeOffset: 109, Skipped: []int64{103, 108}},
				{Line: 10, UnsafeOffset: 109, Skipped: []int64{103}},
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name+"/"+tt.strategy, func(t *testing.T) {
			code, out, stderr := offsets(t, "", "--case", tt.name, "--strategy", tt.strategy, "--json")
			if code != 0 {
				t.Fatalf("exit %d: %s", code, stderr)
			}
			var got struct {
				Steps []struct {
					Op      string
					Outcome string
					Safe    int64
				}
				Violations []struct {
					Line         int
					UnsafeOffset int64 `json:"unsafe_offset"`
					Skipped      []int64
				}
			}
			if err := json.Unmarshal([]byte(out), &got); err != nil {
				t.Fatal(err)
			}
			var outcomes []string
			var safes []int64
			for _, s := range got.Steps {
				if s.Op == "complete" {
					outcomes, safes = append(outcomes, s.Outcome), append(safes, s.Safe)
				}
			}
			if !reflect.DeepEqual(outcomes, tt.outcomes) || !reflect.DeepEqual(safes, tt.safes) {
				t.Errorf("outcomes %v safes %v; want %v %v", outcomes, safes, tt.outcomes, tt.safes)
			}
			var vs []lab.Violation
			for _, v := range got.Violations {
				vs = append(vs, lab.Violation{Line: v.Line, UnsafeOffset: v.UnsafeOffset, Skipped: v.Skipped})
			}
			if !reflect.DeepEqual(vs, tt.violations) {
				t.Errorf("violations %+v, want %+v", vs, tt.violations)
			}
		})
	}
}

// TestMalformed: each malformed script exits 2 with a message naming the line.
func TestMalformed(t *testing.T) {
	tests := []struct {
		name   string
		script string
		line   int
		msg    string
	}{
		{"unknown op", "assign 1 100\nfrob 3\n", 2, `unknown op "frob"`},
		{"bad offset", "assign 1 100\ndeliver 100 1o1\n", 2, `bad offset: "1o1" is not an offset`},
		{"negative offset", "assign 1 100\ndeliver -4\n", 2, `bad offset: "-4" is not an offset`},
		{"bad start", "assign 1 x\n", 1, `bad start`},
		{"bad epoch", "assign one 100\n", 1, `bad epoch`},
		{"bad completion epoch", "assign 1 100\ncomplete 100 -1\n", 2, `bad epoch`},
		{"bad position", "assign 1 100\nposition p\n", 2, `bad position`},
		{"missing arguments", "assign 1\n", 1, `want 2 arguments`},
		{"deliver nothing", "assign 1 100\ndeliver\n", 2, `want at least one offset`},
		{"too many completion arguments", "assign 1 100\ncomplete 1 2 3\n", 2, `want OFFSET [EPOCH]`},
		{"revoke arguments", "assign 1 100\nrevoke 100\n", 2, `takes no arguments`},
		{"out-of-order delivery", "assign 1 100\ndeliver 100 103\n\ndeliver 101\n", 4, `offset 101 is not greater than the previous delivered offset 103`},
		{"repeated delivery", "assign 1 100\ndeliver 100 100\n", 2, `offset 100 is not greater than the previous delivered offset 100`},
		{"delivery below start", "assign 1 100\ndeliver 99\n", 2, `offset 99 is below the start 100`},
		{"delivery below a position", "assign 1 100\nposition 120\ndeliver 110\n", 3, `offset 110 is below the safe offset 120`},
		{"position not above delivered", "assign 1 100\ndeliver 100 105\nposition 105\n", 3, `position 105 is not above the last delivered offset 105`},
		{"epoch not increasing", "assign 2 100\nrevoke\nassign 2 100\n", 3, `epoch 2 is not greater than the previous epoch 2`},
		{"epoch zero", "assign 0 100\n", 1, `epoch 0 must be at least 1`},
		{"deliver before assign", "# first\ndeliver 100\n", 2, `not owned`},
		{"deliver after revoke", "assign 1 100\nrevoke\ndeliver 100\n", 3, `not owned`},
		{"deliver after lost", "assign 1 100\nlost\ndeliver 100\n", 3, `not owned`},
		{"revoke while not owned", "assign 1 100\nrevoke\nrevoke\n", 3, `not owned`},
		{"revoke before assign", "revoke\n", 1, `not owned`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out, stderr := offsets(t, tt.script, "--script", "-")
			if code != 2 {
				t.Fatalf("exit %d, want 2 (stderr %q)", code, stderr)
			}
			if out != "" {
				t.Errorf("stdout %q, want nothing", out)
			}
			wantLine := "stdin: line " + strconv.Itoa(tt.line) + ": "
			if !strings.Contains(stderr, wantLine) || !strings.Contains(stderr, tt.msg) {
				t.Errorf("stderr %q, want it to contain %q and %q", stderr, wantLine, tt.msg)
			}
			_, err := lab.Run(strings.NewReader(tt.script), lab.Prefix)
			var se *lab.ScriptError
			if !errors.Is(err, lab.ErrMalformed) || !errors.As(err, &se) || se.Line != tt.line {
				t.Errorf("Run error %v, want a *ScriptError for line %d", err, tt.line)
			}
		})
	}
}

// TestNotMalformed: these are outcomes, not errors; they exit 0.
func TestNotMalformed(t *testing.T) {
	for _, script := range []string{
		"complete 100\n",                                  // not-owner before any assign
		"assign 1 100\ncomplete 100\n",                    // unknown-offset
		"assign 1 100\ncomplete 100 7\n",                  // old-assignment (an unknown epoch)
		"lost\nassign 1 100\nlost\nlost\n",                // lost while not owned commits nothing
		"assign 1 100\nrevoke\nposition 200\n",            // position while not owned: unchanged
		"assign 1 100\nassign 2 50\ndeliver 50\n",         // reassign while owned, lower start
		"  assign   1   100   # spaces\n\t\n# only\n",     // blanks and comments
		"assign 1 100\ndeliver 100\nposition 101\n",       // position one past the last
		"assign 1 100\ndeliver 100\nlost\ncomplete 100\n", // not-owner after lost
	} {
		if code, _, stderr := offsets(t, script, "--script", "-"); code != 0 {
			t.Errorf("script %q: exit %d (%s)", script, code, stderr)
		}
	}
}

// TestUsageErrorsExit2: a bad command line exits 2, as a malformed script
// does, and says what was wrong; an unreadable file exits 1; -h exits 0.
func TestUsageErrorsExit2(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name string
		args []string
		code int
		msg  string
	}{
		{"unknown flag", []string{"--frob"}, 2, "flag provided but not defined"},
		{"unknown case", []string{"--case", "x"}, 2, `unknown case "x"`},
		{"unknown strategy", []string{"--strategy", "max"}, 2, `unknown strategy "max"`},
		{"case and script", []string{"--case", "normal", "--script", "-"}, 2, "exclusive"},
		{"stray argument", []string{"normal"}, 2, `unexpected argument "normal"`},
		{"missing file", []string{"--script", filepath.Join(dir, "none.lab")}, 1, "no such file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, _, stderr := offsets(t, "", tt.args...)
			if code != tt.code {
				t.Fatalf("exit %d, want %d", code, tt.code)
			}
			if !strings.Contains(stderr, tt.msg) {
				t.Errorf("stderr %q, want %q", stderr, tt.msg)
			}
		})
	}
	if code, out, stderr := offsets(t, "", "-h"); code != 0 || !strings.HasPrefix(out, "usage: tidemark lab offsets") || stderr != "" {
		t.Errorf("-h: exit %d, stdout %q, stderr %q; want 0 and the usage on stdout", code, out, stderr)
	}
}

func TestScriptFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "trace.lab")
	if err := os.WriteFile(path, []byte("assign 1 0\ndeliver 0\nbogus\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, stderr := offsets(t, "", "--script", path)
	if code != 2 || !strings.Contains(stderr, path+": line 3: unknown op") {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
}

func TestDefaultCaseAndTable(t *testing.T) {
	code, out, _ := offsets(t, "")
	if code != 0 || !strings.Contains(out, "case normal, strategy prefix") {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	code, out, _ = offsets(t, "", "--strategy", "naive")
	if code != 0 || !strings.Contains(out, "line 6: naive would commit 109, skipping unfinished 100 103") {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	for _, line := range strings.Split(out, "\n") {
		if strings.HasSuffix(line, " ") {
			t.Errorf("trailing blank in %q", line)
		}
	}
}

func TestCases(t *testing.T) {
	for _, name := range lab.Cases() {
		script, err := lab.Case(name)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := lab.Run(strings.NewReader(script), lab.Naive); err != nil {
			t.Errorf("case %s: %v", name, err)
		}
	}
}
