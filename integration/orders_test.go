//go:build integration

package integration_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidemark/tidemark/integration/bed"
	"github.com/tidemark/tidemark/internal/kafkatest"
	"github.com/tidemark/tidemark/internal/tcpproxy"
)

// ordersBins builds the orders service and its producer, once for the
// tests of the process (a link is seconds of CPU, and the tests that run
// them run side by side).
func ordersBins(t *testing.T) (svc, prod string) {
	t.Helper()
	ordersBinOnce.Do(func() {
		dir, err := os.MkdirTemp("", "tidemark-orders-test")
		if err != nil {
			ordersBinErr = err
			return
		}
		for out, pkg := range map[string]string{"orders": "../examples/orders", "produce": "../examples/orders/produce"} {
			if b, err := exec.Command("go", "build", "-o", filepath.Join(dir, out), pkg).CombinedOutput(); err != nil {
				ordersBinErr = fmt.Errorf("go build %s: %v\n%s", pkg, err, b)
				return
			}
		}
		ordersBinDir = dir
	})
	if ordersBinErr != nil {
		t.Fatal(ordersBinErr)
	}
	return filepath.Join(ordersBinDir, "orders"), filepath.Join(ordersBinDir, "produce")
}

var (
	ordersBinOnce sync.Once
	ordersBinDir  string
	ordersBinErr  error
)

// ordersEnv is one test's topic, group and database schema for the example.
type ordersEnv struct {
	t            *testing.T
	svc, prod    string
	topic, group string
	dsn          string
	pool         *pgxpool.Pool
	schema       string
}

func newOrdersEnv(t *testing.T, partitions int) *ordersEnv {
	svc, prod := ordersBins(t)
	pool := bed.PG(t) // a fresh schema, first on the pool's search_path
	var schema string
	if err := pool.QueryRow(context.Background(), "SELECT current_schema()").Scan(&schema); err != nil {
		t.Fatal(err)
	}
	dsn := os.Getenv("TIDEMARK_PG_DSN")
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	return &ordersEnv{t: t, svc: svc, prod: prod, topic: bed.Topic(t, partitions), group: bed.Group(t),
		dsn: dsn + sep + "search_path=" + schema, pool: pool, schema: schema}
}

// produce runs the producer for orders [start, start+n) at rate per second.
func (e *ordersEnv) produce(start, n int, rate float64) error {
	b, err := exec.Command(e.prod, "-brokers", strings.Join(bed.Kafka(e.t), ","), "-topic", e.topic,
		"-start", fmt.Sprint(start), "-n", fmt.Sprint(n), "-rate", fmt.Sprint(rate)).CombinedOutput()
	if err != nil {
		return fmt.Errorf("produce: %v: %s", err, b)
	}
	return nil
}

// proc is one running instance of the orders service.
type proc struct {
	name string
	cmd  *exec.Cmd
	port int
	done chan struct{}
	mu   sync.Mutex
	logs []map[string]any
}

func (e *ordersEnv) start(name string, port int, extraEnv ...string) *proc {
	e.t.Helper()
	cmd := exec.Command(e.svc, "-brokers", strings.Join(bed.Kafka(e.t), ","), "-group", e.group,
		"-topic", e.topic, "-dlq", e.topic+".dlq", "-http", fmt.Sprintf("127.0.0.1:%d", port))
	// The DSN in the environment, not argv, where ps shows it.
	cmd.Env = append(append(os.Environ(), "TIDEMARK_PG_DSN="+e.dsn), extraEnv...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		e.t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	p := &proc{name: name, cmd: cmd, port: port, done: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var m map[string]any
			if json.Unmarshal(sc.Bytes(), &m) == nil {
				p.mu.Lock()
				p.logs = append(p.logs, m)
				p.mu.Unlock()
			}
		}
		_ = cmd.Wait()
		close(p.done)
	}()
	e.t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// get returns the status code of GET path on the instance, or 0.
func (p *proc) get(path string) int {
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d%s", p.port, path))
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// stop sends SIGTERM and returns the exit status and how long it took.
func (p *proc) stop(t *testing.T, within time.Duration) (int, time.Duration) {
	t.Helper()
	start := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("%s: SIGTERM: %v", p.name, err)
	}
	select {
	case <-p.done:
	case <-time.After(within):
		t.Fatalf("%s did not exit within %s of SIGTERM", p.name, within)
	}
	return p.cmd.ProcessState.ExitCode(), time.Since(start)
}

// entries returns the instance's log lines whose msg is msg.
func (p *proc) entries(msg string) []map[string]any {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []map[string]any
	for _, m := range p.logs {
		if m["msg"] == msg {
			out = append(out, m)
		}
	}
	return out
}

func (e *ordersEnv) applied() int {
	var n int
	if err := e.pool.QueryRow(context.Background(), "SELECT count(*) FROM orders").Scan(&n); err != nil {
		return -1
	}
	return n
}

func (e *ordersEnv) waitApplied(want int, within time.Duration) {
	e.t.Helper()
	st := newStall(within)
	for n := e.applied(); n < want; n = e.applied() {
		if st.over(n) {
			e.t.Fatalf("%d of %d orders applied: %s", n, want, st)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// exactlyOnce checks that n orders were applied once each: n rows, and
// customer totals that count n orders (a duplicate application would count
// one twice; the inbox makes replays no-ops).
func (e *ordersEnv) exactlyOnce(n int) {
	e.t.Helper()
	var rows, counted int64
	ctx := context.Background()
	if err := e.pool.QueryRow(ctx, "SELECT count(*) FROM orders").Scan(&rows); err != nil {
		e.t.Fatal(err)
	}
	if err := e.pool.QueryRow(ctx, "SELECT coalesce(sum(orders), 0) FROM customer_totals").Scan(&counted); err != nil {
		e.t.Fatal(err)
	}
	if rows != int64(n) || counted != int64(n) {
		e.t.Fatalf("%d order rows and %d orders in the totals, want %d of each", rows, counted, n)
	}
}

// TestOrdersSIGTERMMidStream: while orders keep arriving, one of two
// instances gets SIGTERM. It turns readiness off before draining, exits 0
// well within its budget, its last commit for each partition it gave up
// equals that partition's safe offset, the other instance takes the
// partitions over promptly, and at the end every order is applied once.
func TestOrdersSIGTERMMidStream(t *testing.T) {
	t.Parallel()
	const total, partitions = 12_000, 6
	e := newOrdersEnv(t, partitions)
	if err := e.produce(0, 2_000, 0); err != nil {
		t.Fatal(err)
	}
	// Instance a's handlers take 100 ms, so its drain lasts long enough to
	// watch readiness during it.
	a := e.start("a", 18181, "TIDEMARK_SHUTDOWN_BUDGET=10s", "ORDERS_DELAY=100ms")
	b := e.start("b", 18182, "TIDEMARK_SHUTDOWN_BUDGET=10s")
	prodErr := make(chan error, 1)
	go func() { prodErr <- e.produce(2_000, total-2_000, 2_000) }() // 5 s of traffic
	e.waitApplied(4_000, time.Minute)
	// Ready while consuming — but not necessarily at this instant: b's
	// join rebalances the group, and a member between a session's end
	// and its rejoin is not a member, so not ready (shutdown.Probes).
	// On a loaded machine that window can be seconds long.
	kafkatest.WaitFor(t, 30*time.Second, "instance a ready while consuming", func() bool { return a.get("/readyz") == 200 })
	// Watch readiness during the stop: it must be off before the process
	// exits, while it is still draining.
	var sawNotReady sync.WaitGroup
	notReady := make(chan struct{}, 1)
	sawNotReady.Add(1)
	go func() {
		defer sawNotReady.Done()
		for {
			select {
			case <-a.done:
				return
			default:
			}
			if a.get("/readyz") == 503 {
				notReady <- struct{}{}
				return
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()
	code, took := a.stop(t, 15*time.Second)
	sawNotReady.Wait()
	if code != 0 {
		t.Fatalf("instance a exited %d after SIGTERM, want 0", code)
	}
	t.Logf("instance a stopped in %s", took)
	revoked := a.entries("partition revoked")
	if len(revoked) == 0 {
		t.Fatal("instance a logged no revoked partition: it never drained")
	}
	for _, m := range revoked {
		if m["safe"] != m["acknowledged"] {
			t.Errorf("partition %v: last acknowledged commit %v, safe offset %v", m["partition"], m["acknowledged"], m["safe"])
		}
	}
	select {
	case <-notReady:
	default:
		t.Error("readiness never went false between SIGTERM and exit")
	}
	// The other instance takes over: everything produced gets applied.
	if err := <-prodErr; err != nil {
		t.Fatal(err)
	}
	e.waitApplied(total, time.Minute)
	if code, _ := b.stop(t, 15*time.Second); code != 0 {
		t.Fatalf("instance b exited %d, want 0", code)
	}
	e.exactlyOnce(total)
}

// TestOrdersDrainBudgetRunsOut: handlers slower than the shutdown budget.
// The instance exits 3 naming the partitions left unfinished, commits only
// the safe prefix, and the next instance replays the rest: every order
// applied once.
func TestOrdersDrainBudgetRunsOut(t *testing.T) {
	t.Parallel()
	const total, partitions = 300, 3
	e := newOrdersEnv(t, partitions)
	if err := e.produce(0, total, 0); err != nil {
		t.Fatal(err)
	}
	a := e.start("a", 18183, "TIDEMARK_SHUTDOWN_BUDGET=3s", "ORDERS_DELAY=20s")
	deadline := time.Now().Add(time.Minute)
	for len(a.entries("partition assigned")) == 0 && a.get("/readyz") != 200 {
		if time.Now().After(deadline) {
			t.Fatal("instance a never became ready")
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Give it time to have handlers in flight (each takes 20 s).
	time.Sleep(3 * time.Second)
	// No answer within the client's second (0) is the loaded machine's,
	// not the probe's: ask again. A 503 fails at once.
	live := 0
	for range 5 {
		if live = a.get("/livez"); live != 0 {
			break
		}
	}
	if live != 200 {
		t.Fatalf("liveness answered %d while handlers are merely slow (0: no answer in 5 tries of a second)", live)
	}
	code, took := a.stop(t, 10*time.Second)
	if code != 3 {
		t.Fatalf("instance a exited %d, want 3 (drain budget ran out)", code)
	}
	var named string
	for _, m := range a.entries("drain budget ran out") {
		named, _ = m["err"].(string)
	}
	if !strings.Contains(named, e.topic+"/") {
		t.Fatalf("no log line names the unfinished partitions (got %q)", named)
	}
	t.Logf("instance a exited 3 after %s: %s", took, named)
	if e.applied() != 0 {
		t.Fatalf("%d orders applied by handlers that should all have been cut off", e.applied())
	}
	// The safe prefix only: nothing was applied, so nothing past the start
	// may be committed.
	for p, off := range bed.Committed(t, e.group, e.topic) {
		if off > 0 {
			t.Fatalf("partition %d committed %d with nothing applied", p, off)
		}
	}
	b := e.start("b", 18184, "TIDEMARK_SHUTDOWN_BUDGET=10s")
	e.waitApplied(total, time.Minute)
	if code, _ := b.stop(t, 15*time.Second); code != 0 {
		t.Fatalf("instance b exited %d, want 0", code)
	}
	e.exactlyOnce(total)
}

// TestOrdersStartsUnreadyWithoutKafka: started while no broker answers
// (the broker's address dialed through a proxy that refuses), the service
// does not exit: it serves /livez 200 and /readyz 503 naming Kafka, and
// once the broker answers it starts and becomes ready; SIGTERM then stops
// it with exit 0. (It exited 1 after 30 s, serving no probe.)
func TestOrdersStartsUnreadyWithoutKafka(t *testing.T) {
	t.Parallel()
	e := newOrdersEnv(t, 2)
	broker := bed.Kafka(t)[0]
	px, err := tcpproxy.New(broker)
	if err != nil {
		t.Fatal(err)
	}
	defer px.Close()
	px.Cut()
	a := e.start("a", freePort(t), "ORDERS_KAFKA_DIAL="+broker+"="+px.Addr())
	body := func(path string) (int, string) {
		c := http.Client{Timeout: time.Second}
		resp, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d%s", a.port, path))
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	var last string
	kafkatest.WaitFor(t, 30*time.Second, "/readyz 503 naming Kafka while no broker answers", func() bool {
		st, b := body("/readyz")
		last = fmt.Sprint(st, " ", b)
		return st == http.StatusServiceUnavailable && strings.Contains(b, "Kafka")
	})
	if st, b := body("/livez"); st != http.StatusOK {
		t.Errorf("/livez while waiting for Kafka: %d %q, want 200", st, b)
	}
	select {
	case <-a.done:
		t.Fatalf("the service exited while waiting for Kafka (status %d)", a.cmd.ProcessState.ExitCode())
	default:
	}
	t.Logf("while Kafka was unreachable: /readyz %s", strings.TrimSpace(last))
	if err := px.Restore(); err != nil {
		t.Fatal(err)
	}
	kafkatest.WaitFor(t, time.Minute, "/readyz 200 once the broker answers", func() bool { return a.get("/readyz") == http.StatusOK })
	if code, took := a.stop(t, 30*time.Second); code != 0 {
		t.Errorf("exit %d after SIGTERM (in %v), want 0", code, took)
	}
}
