// Command testjson reads the events of `go test -json` and prints what a
// person reads, keeping the events for later: make test runs every go test
// of a phase through it, then asks it where the time went.
//
//	go test -json ./... | testjson -save unit.json
//	testjson -slowest 10 unit.json integration.json
//
// With -save it copies the events to the file and prints go test's text
// without -v: a line per package (ok, FAIL, no test files), the whole
// output of each test that failed, the package output of a package that
// failed (a panic, a data race outside a test, a build error), and a line
// per skipped test, so that a skip is never read as a pass. It exits 1
// when a test or a package failed, or when a package ran no test at all
// (a -run that matched nothing there). With -slowest N it prints the N
// slowest top-level tests of the files it is given, one per line: seconds,
// package, test.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"slices"
	"strings"
)

func main() {
	save := flag.String("save", "", "copy the events of stdin to `file` and print their text")
	slowest := flag.Int("slowest", 0, "print the `n` slowest top-level tests of the files given")
	verbose := flag.Bool("v", false, "with -save: print the output of every test, not only of those that failed")
	flag.Parse()
	var err error
	switch {
	case *save != "" && *slowest == 0 && flag.NArg() == 0:
		var failed bool
		failed, err = saveAndPrint(os.Stdin, os.Stdout, *save, *verbose)
		if err == nil && failed {
			os.Exit(1)
		}
	case *slowest > 0 && *save == "" && flag.NArg() > 0:
		err = printSlowest(os.Stdout, *slowest, flag.Args())
	default:
		fmt.Fprintln(os.Stderr, "usage: go test -json ... | testjson -save FILE\n       testjson -slowest N FILE...")
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "testjson:", err)
		os.Exit(2)
	}
}

// event is one line of `go test -json` (cmd/test2json): build-output and
// build-fail carry ImportPath instead of Package.
type event struct {
	Action     string
	Package    string
	ImportPath string
	Test       string
	Elapsed    float64
	Output     string
}

// saveAndPrint copies r to the file named save and writes the text of its
// events to w (with verbose, the output of the tests that passed too).
// failed reports a test or package that failed. A line that is not an
// event (go test's own messages, such as a package that does not exist) is
// printed as it is.
func saveAndPrint(r io.Reader, w io.Writer, save string, verbose bool) (failed bool, err error) {
	f, err := os.Create(save)
	if err != nil {
		return false, err
	}
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}()
	p := printer{w: w, out: map[key][]string{}, verbose: verbose}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if _, err := f.Write(append(line, '\n')); err != nil {
			return false, err
		}
		var e event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil {
			fmt.Fprintf(w, "%s\n", line)
			continue
		}
		p.event(e)
	}
	if err := sc.Err(); err != nil {
		return false, err
	}
	p.flushBuilds()
	return p.failed, nil
}

// key names whose output is buffered: a test of a package, or (Test "")
// the package itself.
type key struct{ pkg, test string }

// printer turns events into go test's quiet text.
type printer struct {
	w       io.Writer
	out     map[key][]string
	builds  []string // build-output lines not yet printed (a build that failed prints them)
	failed  bool
	verbose bool
}

func (p *printer) event(e event) {
	k := key{e.Package, e.Test}
	switch e.Action {
	case "build-output":
		p.builds = append(p.builds, e.Output)
	case "build-fail":
		p.failed = true
		p.flushBuilds()
	case "output":
		p.out[k] = append(p.out[k], e.Output)
	case "fail":
		p.failed = true
		if e.Test == "" {
			p.flushBuilds()
			// Tests that never ended (a timeout's panic, a crash): what
			// they wrote is all there is of them.
			var open []string
			for o := range p.out {
				if o.pkg == e.Package && o.test != "" {
					open = append(open, o.test)
				}
			}
			slices.Sort(open)
			for _, t := range open {
				o := key{e.Package, t}
				fmt.Fprintf(p.w, "=== %s did not finish; its output:\n%s", t, strings.Join(p.out[o], ""))
				delete(p.out, o)
			}
		}
		fmt.Fprint(p.w, strings.Join(p.out[k], ""))
		delete(p.out, k)
	case "skip":
		if e.Test != "" {
			fmt.Fprintf(p.w, "SKIP %s %s%s\n", e.Package, e.Test, skipReason(p.out[k]))
		} else {
			// A package with no test files: go test's "?" line.
			fmt.Fprint(p.w, strings.Join(p.out[k], ""))
		}
		delete(p.out, k)
	case "pass":
		if e.Test != "" && p.verbose {
			fmt.Fprint(p.w, strings.Join(p.out[k], ""))
		}
		if e.Test == "" {
			// The package's summary line ("ok  \tpkg\t1.2s"), without the
			// PASS line before it.
			for _, l := range p.out[k] {
				if !strings.HasPrefix(l, "ok") {
					continue
				}
				fmt.Fprint(p.w, l)
				if strings.Contains(l, "[no tests to run]") {
					// A -run or -skip that names no test of the package:
					// the phase runs nothing there, which is no pass.
					p.failed = true
					fmt.Fprintf(p.w, "FAIL\t%s: no test ran; the phase's -run names no test of the package\n", e.Package)
				}
			}
		}
		delete(p.out, k)
	}
}

// flushBuilds prints the build output gathered so far.
func (p *printer) flushBuilds() {
	fmt.Fprint(p.w, strings.Join(p.builds, ""))
	p.builds = nil
}

// skipReason is the reason a skipped test gave (its last t.Skip line), or "".
func skipReason(out []string) string {
	for _, l := range slices.Backward(out) {
		l = strings.TrimSpace(l)
		if l != "" && !strings.HasPrefix(l, "---") && !strings.HasPrefix(l, "===") {
			return ": " + l
		}
	}
	return ""
}

// timing is how long one top-level test took.
type timing struct {
	seconds   float64
	pkg, test string
}

// slowest returns the n slowest top-level tests (a subtest counts in its
// parent) of the events in the files, slowest first. A test run more than
// once (-count) counts once per run.
func slowest(n int, files []string) ([]timing, error) {
	var all []timing
	for _, name := range files {
		b, err := os.ReadFile(name)
		if err != nil {
			return nil, err
		}
		for i, line := range strings.Split(string(b), "\n") {
			if !strings.HasPrefix(line, "{") {
				continue
			}
			var e event
			if err := json.Unmarshal([]byte(line), &e); err != nil {
				return nil, fmt.Errorf("%s:%d: %w", name, i+1, err)
			}
			if (e.Action == "pass" || e.Action == "fail") && e.Test != "" && !strings.Contains(e.Test, "/") {
				all = append(all, timing{e.Elapsed, e.Package, e.Test})
			}
		}
	}
	if len(all) == 0 {
		return nil, errors.New("no test results in " + strings.Join(files, ", "))
	}
	slices.SortStableFunc(all, func(a, b timing) int {
		switch {
		case a.seconds > b.seconds:
			return -1
		case a.seconds < b.seconds:
			return 1
		}
		return 0
	})
	return all[:min(n, len(all))], nil
}

func printSlowest(w io.Writer, n int, files []string) error {
	ts, err := slowest(n, files)
	if err != nil {
		return err
	}
	for _, t := range ts {
		fmt.Fprintf(w, "%7.1fs  %-14s %s\n", t.seconds, path.Base(t.pkg), t.test)
	}
	return nil
}
