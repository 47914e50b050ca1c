package testbed

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// The verbs of a cluster: a node frozen and thawed, and where a partition's
// leader and a group's coordinator are. Stop (with Crash), Start and
// Restart of one node are bed.go's.

// Pause stops the JVMs of the Kafka nodes s names with SIGSTOP, as a
// machine that hangs: the sockets stay open, nothing answers. It returns
// once the kernel reports each stopped. Resume, Start, Stop, Restart and
// Down continue a paused node first. Only Kafka nodes can be paused.
func (b *Bed) Pause(ctx context.Context, s Service) error {
	if s.Kind != Kafka {
		return fmt.Errorf("pause %s: only Kafka nodes can be paused", s)
	}
	return b.one(ctx, s, func(st *State) error {
		var errs []error
		for _, n := range st.nodes(s) {
			errs = append(errs, b.pauseNode(n, len(st.Kafka.Nodes)))
		}
		return errors.Join(errs...)
	})
}

// Resume continues the paused Kafka nodes s names with SIGCONT; a node
// that is not paused is left alone.
func (b *Bed) Resume(ctx context.Context, s Service) error {
	if s.Kind != Kafka {
		return fmt.Errorf("resume %s: only Kafka nodes can be paused", s)
	}
	return b.one(ctx, s, func(st *State) error {
		var errs []error
		for _, n := range st.nodes(s) {
			if !n.Paused {
				b.say("%s is not paused", nodeName(n, len(st.Kafka.Nodes)))
				continue
			}
			errs = append(errs, b.resumeNode(n, len(st.Kafka.Nodes)))
		}
		return errors.Join(errs...)
	})
}

func nodeName(n *Broker, nodes int) string {
	if nodes > 1 {
		return fmt.Sprintf("Kafka node %d", n.ID)
	}
	return "Kafka"
}

func (b *Bed) pauseNode(n *Broker, nodes int) error {
	name := nodeName(n, nodes)
	if !ours(n.PID, n.mark()) {
		return fmt.Errorf("pause %s: it does not run (start it first)", name)
	}
	b.say("pausing %s (pid %d, SIGSTOP)", name, n.PID)
	if err := syscall.Kill(n.PID, syscall.SIGSTOP); err != nil {
		return fmt.Errorf("pause %s: SIGSTOP to pid %d: %w", name, n.PID, err)
	}
	n.Paused = true
	// SIGSTOP is delivered asynchronously: wait until the kernel says so.
	deadline := time.Now().Add(5 * time.Second)
	for procState(n.PID) != 'T' {
		if time.Now().After(deadline) {
			return fmt.Errorf("pause %s: pid %d is not stopped 5s after SIGSTOP (state %q)", name, n.PID, procState(n.PID))
		}
		time.Sleep(10 * time.Millisecond)
	}
	return nil
}

func (b *Bed) resumeNode(n *Broker, nodes int) error {
	name := nodeName(n, nodes)
	if !ours(n.PID, n.mark()) {
		n.Paused = false
		return nil
	}
	b.say("continuing %s (pid %d, SIGCONT)", name, n.PID)
	if err := syscall.Kill(n.PID, syscall.SIGCONT); err != nil {
		return fmt.Errorf("continue %s: SIGCONT to pid %d: %w", name, n.PID, err)
	}
	n.Paused = false
	return nil
}

// procState is the state letter of /proc/pid/stat (R, S, T, Z, …); 0 when
// it cannot be read.
func procState(pid int) byte {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 || i+2 >= len(b) {
		return 0
	}
	return b[i+2]
}

// Nodes returns the ids of the bed's Kafka nodes, from its state file.
func (b *Bed) Nodes() ([]int32, error) {
	st, err := b.state()
	if err != nil {
		return nil, err
	}
	ids := make([]int32, len(st.Kafka.Nodes))
	for i, n := range st.Kafka.Nodes {
		ids[i] = n.ID
	}
	return ids, nil
}

func (b *Bed) state() (*State, error) {
	st, err := loadState(b.cfg.Dir)
	if err != nil {
		return nil, err
	}
	if st == nil || st.Kafka == nil || len(st.Kafka.Nodes) == 0 {
		return nil, fail(fmt.Sprintf("no test bed was set up in %s (no %s): run scripts/testbed up first.", b.cfg.Dir, statePath(b.cfg.Dir)))
	}
	return st, nil
}

// admin is a kadm client on the bed's brokers, and the function that
// closes it. Its requests go to any broker that answers: a node that is
// down is skipped after a refused dial, a paused one costs a request
// timeout (bounded by ctx).
func (b *Bed) admin() (*kadm.Client, func(), error) {
	st, err := b.state()
	if err != nil {
		return nil, nil, err
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(st.Brokers(), ",")...),
		kgo.DialTimeout(time.Second), kgo.RequestTimeoutOverhead(3*time.Second), kgo.RetryTimeout(10*time.Second))
	if err != nil {
		return nil, nil, err
	}
	return kadm.NewClient(cl), cl.Close, nil
}

// Leader returns the node id of the leader of topic's partition, as the
// metadata of the cluster says now (-1 when it has none, with an error).
func (b *Bed) Leader(ctx context.Context, topic string, partition int32) (int32, error) {
	adm, done, err := b.admin()
	if err != nil {
		return -1, err
	}
	defer done()
	td, err := adm.ListTopics(ctx, topic)
	if err != nil {
		return -1, fmt.Errorf("leader of %s/%d: %w", topic, partition, err)
	}
	t, ok := td[topic]
	if !ok || t.Err != nil {
		return -1, fmt.Errorf("leader of %s/%d: topic: %v", topic, partition, t.Err)
	}
	p, ok := t.Partitions[partition]
	switch {
	case !ok:
		return -1, fmt.Errorf("leader of %s/%d: the topic has %d partitions", topic, partition, len(t.Partitions))
	case p.Err != nil:
		return -1, fmt.Errorf("leader of %s/%d: %w", topic, partition, p.Err)
	case p.Leader < 0:
		return -1, fmt.Errorf("leader of %s/%d: none now", topic, partition)
	}
	return p.Leader, nil
}

// Coordinator returns the node id of group's coordinator (FindCoordinator).
func (b *Bed) Coordinator(ctx context.Context, group string) (int32, error) {
	adm, done, err := b.admin()
	if err != nil {
		return -1, err
	}
	defer done()
	r := adm.FindGroupCoordinators(ctx, group)
	c, ok := r[group]
	if !ok {
		return -1, fmt.Errorf("coordinator of group %s: no answer", group)
	}
	if c.Err != nil {
		return -1, fmt.Errorf("coordinator of group %s: %w", group, c.Err)
	}
	return c.NodeID, nil
}

// WaitInSync waits, within timeout, until every node of the bed is in the
// metadata and every partition of every topic (the internal ones included)
// has a leader and all its replicas in sync: what a rolling restart waits
// for before the next node. It returns the partitions still short.
func (b *Bed) WaitInSync(ctx context.Context, timeout time.Duration) error {
	st, err := b.state()
	if err != nil {
		return err
	}
	adm, done, err := b.admin()
	if err != nil {
		return err
	}
	defer done()
	deadline := time.Now().Add(timeout)
	var short []string
	for {
		short, err = outOfSync(ctx, adm, len(st.Kafka.Nodes))
		if err == nil && len(short) == 0 {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if time.Now().After(deadline) {
			if err != nil {
				return fmt.Errorf("the cluster was not in sync within %s: %w", timeout, err)
			}
			return fmt.Errorf("the cluster was not in sync within %s: %d partitions short (%s)", timeout, len(short), head(short, 8))
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// outOfSync lists the partitions without a leader or with a replica out of
// the ISR, and fails when fewer than nodes brokers are registered.
func outOfSync(ctx context.Context, adm *kadm.Client, nodes int) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	md, err := adm.Metadata(ctx)
	if err != nil {
		return nil, err
	}
	if len(md.Brokers) < nodes {
		return nil, fmt.Errorf("%d of %d brokers registered", len(md.Brokers), nodes)
	}
	var short []string
	for _, t := range md.Topics.Sorted() {
		if t.Err != nil {
			short = append(short, t.Topic+": "+t.Err.Error())
			continue
		}
		for _, p := range t.Partitions.Sorted() {
			if p.Leader < 0 || len(p.ISR) < len(p.Replicas) || p.Err != nil {
				short = append(short, fmt.Sprintf("%s/%d (leader %d, isr %v of %v)", t.Topic, p.Partition, p.Leader, p.ISR, p.Replicas))
			}
		}
	}
	slices.Sort(short)
	return short, nil
}

func head(xs []string, n int) string {
	if len(xs) > n {
		return strings.Join(xs[:n], ", ") + fmt.Sprintf(", … (%d more)", len(xs)-n)
	}
	return strings.Join(xs, ", ")
}
