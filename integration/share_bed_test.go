//go:build integration

package integration_test

// Smoke tests of the test bed's share groups (KIP-932, Kafka 4.4): with a
// plain franz-go share consumer and no tidemark code, they prove what the
// share-group source's tests rely on — the feature level, acknowledgement,
// the lowered acquisition lock and the broker's dead-letter queue
// (docs/testbed.md, "Broker settings").

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tidemark/tidemark/integration/bed"
)

const shareBedTimeout = time.Minute

// shareBedGroupConfig sets configs (name, value, ...) of share group group
// with IncrementalAlterConfigs on the GROUP resource, then waits until
// DescribeConfigs shows them: the broker applies group configs
// asynchronously, and a member that joins before would start with the old
// ones (share.auto.offset.reset=latest, and see nothing produced before).
func shareBedGroupConfig(t *testing.T, group string, kvs ...string) {
	t.Helper()
	cl := bed.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), shareBedTimeout)
	defer cancel()
	want := map[string]string{}
	req := kmsg.NewPtrIncrementalAlterConfigsRequest()
	res := kmsg.NewIncrementalAlterConfigsRequestResource()
	res.ResourceType = kmsg.ConfigResourceTypeGroupConfig
	res.ResourceName = group
	for i := 0; i+1 < len(kvs); i += 2 {
		c := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
		c.Name, c.Op, c.Value = kvs[i], 0, kmsg.StringPtr(kvs[i+1]) // 0: SET
		res.Configs = append(res.Configs, c)
		want[kvs[i]] = kvs[i+1]
	}
	req.Resources = append(req.Resources, res)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		t.Fatalf("share group %s: IncrementalAlterConfigs: %v", group, err)
	}
	for _, r := range resp.Resources {
		if err := kerr.ErrorForCode(r.ErrorCode); err != nil {
			t.Fatalf("share group %s: set %v: %v (%s)", group, want, err, shareBedDeref(r.ErrorMessage))
		}
	}
	for {
		dreq := kmsg.NewPtrDescribeConfigsRequest()
		dres := kmsg.NewDescribeConfigsRequestResource()
		dres.ResourceType = kmsg.ConfigResourceTypeGroupConfig
		dres.ResourceName = group
		dreq.Resources = append(dreq.Resources, dres)
		dresp, err := dreq.RequestWith(ctx, cl)
		if err != nil {
			t.Fatalf("share group %s: DescribeConfigs: %v", group, err)
		}
		got := map[string]string{}
		for _, r := range dresp.Resources {
			for _, c := range r.Configs {
				got[c.Name] = shareBedDeref(c.Value)
			}
		}
		applied := true
		for k, v := range want {
			applied = applied && got[k] == v
		}
		if applied {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("share group %s: configs %v not applied after %v (describe: %v)", group, want, shareBedTimeout, got)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func shareBedDeref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// shareBedPoll polls cl until it has n records, giving each to ack as it
// arrives (ack must settle it: the next poll would accept it), and fails
// the test on a fetch error or when n records do not arrive in time.
func shareBedPoll(t *testing.T, cl *kgo.Client, n int, ack func(*kgo.Record)) []*kgo.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), shareBedTimeout)
	defer cancel()
	var got []*kgo.Record
	for len(got) < n {
		fs := cl.PollRecords(ctx, n-len(got))
		if ctx.Err() != nil {
			t.Fatalf("share consumer: %d of %d records after %v", len(got), n, shareBedTimeout)
		}
		for _, e := range fs.Errors() {
			// The first ShareFetch of a session may end in this.
			if _, ok := errors.AsType[*kgo.ErrFirstReadEOF](e.Err); !ok {
				t.Fatalf("share fetch %s/%d: %v", e.Topic, e.Partition, e.Err)
			}
		}
		for _, r := range fs.Records() {
			ack(r)
			got = append(got, r)
		}
	}
	return got
}

// shareBedFeature fails the test unless the bed's broker finalizes
// share.version 2, the level of share groups with the broker's
// dead-letter queue (Kafka 4.4): the other tests here would only time out.
func shareBedFeature(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), shareBedTimeout)
	defer cancel()
	resp, err := kmsg.NewPtrApiVersionsRequest().RequestWith(ctx, bed.Client(t))
	if err != nil {
		t.Fatalf("ApiVersions: %v", err)
	}
	var level int16 = -1
	for _, f := range resp.FinalizedFeatures {
		if f.Name == "share.version" {
			level = f.MaxVersionLevel
		}
	}
	if level < 2 {
		t.Fatalf("the broker finalizes share.version %d (-1: none), want 2: share groups with their DLQ need Kafka 4.4, "+
			"which scripts/testbed runs and formats with share.version=2 unless TIDEMARK_KAFKA_VERSION picks an older release", level)
	}
}

// TestShareBedFeature: the bed's broker has share groups with their DLQ.
func TestShareBedFeature(t *testing.T) { shareBedFeature(t) }

// TestShareBedConsume: records produced before a share consumer joins are
// delivered once each (share.auto.offset.reset=earliest), with delivery
// count 1, and once they are accepted DescribeShareGroupOffsets reports a
// lag of 0 on every partition: the acks reached the broker. (Its
// StartOffset is the persisted share-partition start offset, which trails:
// on 4.4 it moved to 5 only when records 5-9 were accepted after 0-4,
// so it is not what this checks.)
func TestShareBedConsume(t *testing.T) {
	t.Parallel()
	shareBedFeature(t)
	const n, partitions = 40, 2
	topic := bed.Topic(t, partitions)
	group := bed.Name(t, "share")
	shareBedGroupConfig(t, group, "share.auto.offset.reset", "earliest")
	bed.Produce(t, topic, n, func(i int) string { return "k" + strconv.Itoa(i%8) })

	cl := bed.Client(t, kgo.ShareGroup(group), kgo.ConsumeTopics(topic))
	seen := make([]bool, n)
	recs := shareBedPoll(t, cl, n, func(r *kgo.Record) { r.Ack(kgo.AckAccept) })
	for _, r := range recs {
		i, err := strconv.Atoi(string(r.Value))
		if err != nil || i < 0 || i >= n || seen[i] {
			t.Fatalf("p%d@%d: value %q is not a produced index, or came twice", r.Partition, r.Offset, r.Value)
		}
		seen[i] = true
		if c := r.DeliveryCount(); c != 1 {
			t.Errorf("p%d@%d: delivery count %d, want 1", r.Partition, r.Offset, c)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), shareBedTimeout)
	defer cancel()
	if err := cl.FlushAcks(ctx); err != nil {
		t.Fatalf("FlushAcks: %v", err)
	}

	ends := bed.EndOffsets(t, topic)
	adm := bed.Admin(t)
	var last kadm.ShareOffsets
	for {
		got, err := adm.DescribeShareGroupOffsets(ctx, group)
		if err == nil {
			err = got.Error()
		}
		if err != nil {
			t.Fatalf("DescribeShareGroupOffsets %s: %v", group, err)
		}
		last = got[group].Offsets
		done := true
		for p := range ends {
			o, ok := last.Lookup(topic, p)
			done = done && ok && o.Err == nil && o.Lag == 0
		}
		if done {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("share group offsets %v (ends %v): the lag is not 0 on every partition after accepting all %d records", last[topic], ends, n)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// TestShareBedLockExpiry: a group may lower its acquisition lock to 1 s
// (the bed's group.share.min.record.lock.duration.ms; Kafka's is 15 s and
// refuses this config), and a record held past it without an ack is
// delivered to another member, with delivery count 2.
func TestShareBedLockExpiry(t *testing.T) {
	t.Parallel()
	shareBedFeature(t)
	const lock = time.Second
	topic := bed.Topic(t, 1)
	group := bed.Name(t, "share")
	shareBedGroupConfig(t, group, "share.auto.offset.reset", "earliest",
		"share.record.lock.duration.ms", strconv.Itoa(int(lock.Milliseconds())))
	bed.Produce(t, topic, 1, nil)

	// holder fetches only while it polls (MaxConcurrentFetches(0)), so it
	// does not take the record again itself once its lock expires. It
	// stays open until the end: closing it would release the record.
	holder := bed.Client(t, kgo.ShareGroup(group), kgo.ConsumeTopics(topic), kgo.MaxConcurrentFetches(0))
	held := shareBedPoll(t, holder, 1, func(*kgo.Record) {})[0]
	acquired := time.Now()
	if left := time.Until(held.AcquisitionDeadline()); left > lock || held.DeliveryCount() != 1 {
		t.Fatalf("held record: lock left %v (want at most the group's %v), delivery count %d (want 1)", left, lock, held.DeliveryCount())
	}

	other := bed.Client(t, kgo.ShareGroup(group), kgo.ConsumeTopics(topic))
	again := shareBedPoll(t, other, 1, func(r *kgo.Record) { r.Ack(kgo.AckAccept) })[0]
	after := time.Since(acquired)
	if again.Offset != held.Offset || again.DeliveryCount() != 2 {
		t.Fatalf("redelivered p%d@%d with delivery count %d; want @%d with count 2", again.Partition, again.Offset, again.DeliveryCount(), held.Offset)
	}
	t.Logf("record @%d redelivered to the other member %v after its acquisition (lock %v)", again.Offset, after.Round(time.Millisecond), lock)
}

// TestShareBedDLQ: a record a member rejects lands in the group's
// dead-letter topic (group config errors.deadletterqueue.topic.name, a
// name with the bed's prefix "dlq.", on a topic created with
// errors.deadletterqueue.group.enable=true), copied with the broker's
// context headers; the accepted records do not.
func TestShareBedDLQ(t *testing.T) {
	t.Parallel()
	shareBedFeature(t)
	const n, reject = 5, 2
	c := bed.Cluster(t)
	topic := c.Topic(1)
	dlq := "dlq." + bed.Name(t, "topic")
	c.CreateTopic(dlq, 1)
	ctx, cancel := context.WithTimeout(context.Background(), shareBedTimeout)
	defer cancel()
	adm := bed.Admin(t)
	altered, err := adm.AlterTopicConfigs(ctx, []kadm.AlterConfig{{Name: "errors.deadletterqueue.group.enable", Value: kmsg.StringPtr("true")}}, dlq)
	for _, r := range altered {
		if err == nil && r.Err != nil {
			err = fmt.Errorf("%w (%s)", r.Err, r.ErrMessage)
		}
	}
	if err != nil {
		t.Fatalf("enable %s as a DLQ: %v", dlq, err)
	}
	group := bed.Name(t, "share")
	shareBedGroupConfig(t, group, "share.auto.offset.reset", "earliest",
		"errors.deadletterqueue.topic.name", dlq, "errors.deadletterqueue.copy.record.enable", "true")
	bed.Produce(t, topic, n, nil)

	cl := bed.Client(t, kgo.ShareGroup(group), kgo.ConsumeTopics(topic))
	var rejected *kgo.Record
	shareBedPoll(t, cl, n, func(r *kgo.Record) {
		if string(r.Value) == strconv.Itoa(reject) {
			rejected = r
			r.Ack(kgo.AckReject)
			return
		}
		r.Ack(kgo.AckAccept)
	})
	if err := cl.FlushAcks(ctx); err != nil {
		t.Fatalf("FlushAcks: %v", err)
	}

	rd := bed.Client(t, kgo.ConsumeTopics(dlq), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	fs := rd.PollRecords(ctx, 10)
	if err := fs.Err0(); err != nil {
		t.Fatalf("read %s: %v", dlq, err)
	}
	recs := fs.Records()
	if len(recs) != 1 {
		t.Fatalf("%s holds %d records, want the 1 rejected", dlq, len(recs))
	}
	d := recs[0]
	headers := map[string]string{}
	for _, h := range d.Headers {
		headers[h.Key] = string(h.Value)
	}
	t.Logf("DLQ record: value %q, headers %v", d.Value, headers)
	if string(d.Value) != string(rejected.Value) {
		t.Errorf("DLQ record value %q, want the rejected record's %q (copy.record.enable)", d.Value, rejected.Value)
	}
	for k, want := range map[string]string{"__dlq.errors.topic": topic, "__dlq.errors.partition": "0",
		"__dlq.errors.offset": strconv.FormatInt(rejected.Offset, 10), "__dlq.errors.group": group} {
		if headers[k] != want {
			t.Errorf("DLQ header %s = %q, want %q", k, headers[k], want)
		}
	}
	if ends := bed.EndOffsets(t, dlq); ends[0] != 1 {
		t.Errorf("%s ends at %d, want 1: only the rejected record", dlq, ends[0])
	}
}
