package franz_test

import (
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"testing/synctest"

	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/source/franz"
)

func tp(p int32) runner.TP { return runner.TP{Topic: "t", Partition: p} }

func tps(ps ...int32) []runner.TP {
	var out []runner.TP
	for _, p := range ps {
		out = append(out, tp(p))
	}
	return out
}

func offsets(ps ...int32) []runner.Offset {
	var out []runner.Offset
	for _, p := range ps {
		out = append(out, runner.Offset{TP: tp(p), Offset: 100})
	}
	return out
}

func offsetTPs(os []runner.Offset) []runner.TP {
	var out []runner.TP
	for _, o := range os {
		out = append(out, o.TP)
	}
	return out
}

// TestOwnershipAssign: an assignment owns its partitions under the member
// id it came with, and reports (sorted) those still owned under another
// member id that it does not name: franz-go kept them across a rejoin
// under a new member id.
func TestOwnershipAssign(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		before   map[string][]runner.TP // member id -> partitions owned under it
		member   string
		assign   []runner.TP
		rejoined []runner.TP
		count    int
	}{
		{name: "first assignment", member: "m", assign: tps(0, 1), count: 2},
		{name: "same member adds", before: map[string][]runner.TP{"m": tps(0)}, member: "m", assign: tps(1), count: 2},
		{name: "new member id keeps what it was not given", before: map[string][]runner.TP{"old": tps(2, 0, 1)}, member: "new", assign: tps(1), rejoined: tps(0, 2), count: 3},
		{name: "new member id given it all", before: map[string][]runner.TP{"old": tps(0)}, member: "new", assign: tps(0), count: 1},
		{name: "nothing new", before: map[string][]runner.TP{"old": tps(0), "new": tps(1)}, member: "new", rejoined: tps(0), count: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := franz.NewOwnership()
			for m, ps := range tc.before {
				o.Assign(m, ps)
			}
			if got := o.Assign(tc.member, tc.assign); !slices.Equal(got, tc.rejoined) {
				t.Errorf("rejoined %v, want %v", got, tc.rejoined)
			}
			if got := o.Count(); got != tc.count {
				t.Errorf("owns %d partitions, want %d", got, tc.count)
			}
			// Everything assigned is committable under the member now.
			owned, _, _, _ := o.ForCommit(tc.member, offsets(0, 1, 2), nil)
			for _, p := range tc.assign {
				if !slices.Contains(offsetTPs(owned), p) {
					t.Errorf("%s not committable under %s after its assignment (committable: %v)", p, tc.member, offsetTPs(owned))
				}
			}
		})
	}
}

// TestOwnershipAssignedBefore: of the partitions franz-go revokes, those
// owned under an earlier member id are told apart (they were lost when the
// member was removed); the rest, owned under the current id or not owned
// at all, stay in order.
func TestOwnershipAssignedBefore(t *testing.T) {
	t.Parallel()
	o := franz.NewOwnership()
	o.Assign("old", tps(0, 3))
	o.Assign("new", tps(1))
	rest, earlier := o.AssignedBefore("new", tps(0, 1, 2, 3))
	if !slices.Equal(rest, tps(1, 2)) || !slices.Equal(earlier, tps(0, 3)) {
		t.Fatalf("rest %v, earlier %v; want %v and %v", rest, earlier, tps(1, 2), tps(0, 3))
	}
	if o.Count() != 3 {
		t.Fatalf("owns %d after the question, want 3: asking changes nothing", o.Count())
	}
}

// TestOwnershipForCommit: a commit's offsets are sent only for partitions
// owned under the member id the client has now; those revoked, lost, never
// assigned or assigned under another member id are not.
func TestOwnershipForCommit(t *testing.T) {
	t.Parallel()
	o := franz.NewOwnership()
	o.Assign("m", tps(0, 1, 2))
	o.Assign("other", tps(3)) // 0-2 stay under m (rejoined), 3 under other
	o.Disown(tps(2))
	owned, notOwned, floors, _ := o.ForCommit("m", offsets(4, 3, 2, 1, 0), nil)
	if !slices.Equal(offsetTPs(owned), tps(1, 0)) || !slices.Equal(notOwned, tps(4, 3, 2)) || floors != nil {
		t.Fatalf("owned %v, not owned %v, floors %v; want %v, %v and none", offsetTPs(owned), notOwned, floors, tps(1, 0), tps(4, 3, 2))
	}
	if owned[0].Offset != 100 || owned[1].Offset != 100 {
		t.Fatalf("offsets changed: %v", owned)
	}
}

// TestOwnershipFloors: a rejoined partition whose committed offset could
// not be read gets a floor. Its first commit reads it (once it succeeds,
// never again); an offset below it is withheld, logged the first time
// only; one at or above it is sent; while the read fails every offset is
// withheld with the read's error. An assignment franz-go fetched the start
// of, or a revoke or loss, ends the floor.
func TestOwnershipFloors(t *testing.T) {
	t.Parallel()
	o := franz.NewOwnership()
	o.Assign("old", tps(0, 1, 2))
	o.Rejoin("new", tps(0, 1, 2), tps(1, 2))
	errRead := errors.New("read failed")
	var reads int
	read := func(floor int64, err error) func(runner.TP) (int64, error) {
		return func(runner.TP) (int64, error) { reads++; return floor, err }
	}
	at := func(off int64, ps ...int32) []runner.Offset {
		var out []runner.Offset
		for _, p := range ps {
			out = append(out, runner.Offset{TP: tp(p), Offset: off})
		}
		return out
	}
	verdicts := func(vs []franz.FloorVerdict) (withheld, logged []runner.TP, failed int) {
		for _, v := range vs {
			if v.Withheld {
				withheld = append(withheld, v.TP)
			}
			if v.Log {
				logged = append(logged, v.TP)
			}
			if v.Err != nil {
				if !errors.Is(v.Err, errRead) {
					t.Errorf("%s: error %v, want the read's", v.TP, v.Err)
				}
				failed++
			}
		}
		return withheld, logged, failed
	}

	for i, step := range []struct {
		name            string
		offsets         []runner.Offset
		read            func(runner.TP) (int64, error)
		wantReads       int
		withheld, logAt []runner.TP
		failed          int
	}{
		{name: "the read fails", offsets: at(50, 0, 1, 2), read: read(0, errRead), wantReads: 2, withheld: tps(1, 2), failed: 2},
		{name: "read: below the floor", offsets: at(50, 0, 1, 2), read: read(60, nil), wantReads: 2, withheld: tps(1, 2), logAt: tps(1, 2)},
		{name: "below again: not read, not logged", offsets: at(59, 1, 2), withheld: tps(1, 2)},
		{name: "at the floor", offsets: at(60, 1), withheld: nil},
		{name: "above the floor", offsets: at(61, 2), withheld: nil},
	} {
		reads = 0
		owned, notOwned, vs, _ := o.ForCommit("new", step.offsets, step.read)
		if len(notOwned) > 0 || len(owned) != len(step.offsets) {
			t.Fatalf("step %d (%s): owned %v, not owned %v; want all owned", i, step.name, owned, notOwned)
		}
		withheld, logged, failed := verdicts(vs)
		if reads != step.wantReads || !slices.Equal(withheld, step.withheld) || !slices.Equal(logged, step.logAt) || failed != step.failed {
			t.Fatalf("step %d (%s): %d reads, withheld %v, logged %v, %d failed; want %d, %v, %v, %d",
				i, step.name, reads, withheld, logged, failed, step.wantReads, step.withheld, step.logAt, step.failed)
		}
	}

	// The floor ends with an assignment franz-go fetched the start of
	// (1), and with a revoke or loss (2, owned again afterwards).
	o.Assign("new", tps(1))
	o.Disown(tps(2))
	o.Assign("new", tps(2))
	if _, _, vs, _ := o.ForCommit("new", at(0, 0, 1, 2), nil); vs != nil {
		t.Fatalf("floors after a new assignment: %v, want none", vs)
	}
}

// TestOwnershipAdmit: the check of a commit request leaves in it only the
// partitions owned under the member id the request carries, and refuses
// the others; a request left empty is not registered (nothing to wait for).
func TestOwnershipAdmit(t *testing.T) {
	t.Parallel()
	o := franz.NewOwnership()
	o.Assign("m", tps(0, 1))
	o.Assign("n", tps(2)) // 0 and 1 stay under m
	for _, tc := range []struct {
		member           string
		ask              []runner.TP
		admitted, refuse []runner.TP
	}{
		{member: "m", ask: tps(0, 1, 2, 3), admitted: tps(0, 1), refuse: tps(2, 3)},
		{member: "n", ask: tps(0, 2), admitted: tps(2), refuse: tps(0)},
		{member: "x", ask: tps(0, 1), refuse: tps(0, 1)},
	} {
		req := commitRequest(tc.member, tc.ask...)
		answered, refused := o.Admit(req)
		if got := requestTPs(req); !slices.Equal(got, tc.admitted) || !slices.Equal(refused, tc.refuse) {
			t.Errorf("%s asks %v: admitted %v, refused %v; want %v and %v", tc.member, tc.ask, got, refused, tc.admitted, tc.refuse)
		}
		if (answered != nil) != (len(tc.admitted) > 0) {
			t.Errorf("%s asks %v: registered %v, want %v", tc.member, tc.ask, answered != nil, len(tc.admitted) > 0)
		}
		if answered != nil {
			answered()
		}
	}
}

// TestOwnershipDisownWaitsForAdmitted: giving partitions up returns only
// once every commit admitted for one of them was answered, and admits
// none for them afterwards; a commit of other partitions holds nothing
// up, and answering a commit never waits for a disown in progress (no
// lock is held while disown waits).
func TestOwnershipDisownWaitsForAdmitted(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		o := franz.NewOwnership()
		o.Assign("m", tps(0, 1, 2))
		answer01, _ := o.Admit(commitRequest("m", tp(0), tp(1)))
		answer1, _ := o.Admit(commitRequest("m", tp(1)))
		answer2, _ := o.Admit(commitRequest("m", tp(2)))

		var gone atomic.Bool
		go func() {
			o.Disown(tps(0))
			gone.Store(true)
		}()
		synctest.Wait()
		if gone.Load() {
			t.Fatal("disown of t/0 returned while a commit naming it was unanswered")
		}
		// What a disown in progress leaves working: other commits'
		// answers, the poll path's count, and other partitions' checks.
		answer2()
		answer1()
		if got := o.Count(); got != 2 {
			t.Fatalf("owns %d while t/0 is being given up, want 2", got)
		}
		req := commitRequest("m", tp(0), tp(1))
		answerLate, refused := o.Admit(req)
		if got := requestTPs(req); !slices.Equal(got, tps(1)) || !slices.Equal(refused, tps(0)) {
			t.Fatalf("during the disown: admitted %v, refused %v; want %v and %v", got, refused, tps(1), tps(0))
		}
		synctest.Wait()
		if gone.Load() {
			t.Fatal("disown of t/0 returned before the commit naming it was answered")
		}
		answer01()
		synctest.Wait()
		if !gone.Load() {
			t.Fatal("disown of t/0 did not return once the commit naming it was answered")
		}
		// A commit of t/1 only, still unanswered, does not hold up a
		// disown of t/2.
		o.Disown(tps(2))
		answerLate()
		if got := o.Count(); got != 1 {
			t.Fatalf("owns %d, want 1 (t/1)", got)
		}
	})
}
