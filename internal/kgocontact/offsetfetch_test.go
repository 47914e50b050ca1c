package kgocontact_test

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tidemark/tidemark/internal/kgocontact"
)

// TestWatchConnOffsetFetchV1Refused: before version 2 an OffsetFetch
// answer has no top-level error code, and a broker puts a group-level
// error (NOT_COORDINATOR, ...) on every partition instead. kafka-go sends
// OffsetFetch v1, so that answer is a refusal, as the same partition error
// of an OffsetCommit answer is (firstGroupLevel); it must not count as
// contact.
func TestWatchConnOffsetFetchV1Refused(t *testing.T) {
	of := kmsg.NewPtrOffsetFetchRequest()
	of.SetVersion(1)
	ofr := of.ResponseKind().(*kmsg.OffsetFetchResponse)
	ofr.SetVersion(1)
	topic := kmsg.NewOffsetFetchResponseTopic()
	topic.Topic = "t"
	part := kmsg.NewOffsetFetchResponseTopicPartition()
	part.Offset = -1
	part.ErrorCode = kerr.NotCoordinator.Code
	topic.Partitions = append(topic.Partitions, part)
	ofr.Topics = append(ofr.Topics, topic)

	pc := &pipeConn{}
	var got []kgocontact.Answer
	c := kgocontact.WatchConn(pc, func(a kgocontact.Answer) { got = append(got, a) })
	if _, err := c.Write(request(of, 1)); err != nil {
		t.Fatal(err)
	}
	pc.r.Write(response(ofr, 1))
	buf := make([]byte, 4096)
	for n, _ := c.Read(buf); n > 0; n, _ = c.Read(buf) {
	}
	if len(got) != 1 {
		t.Fatalf("%d answers reported, want 1", len(got))
	}
	if a := got[0]; !a.Refused() {
		t.Errorf("OffsetFetch v1 answered NOT_COORDINATOR on its partitions: err %v, refused %v; want NOT_COORDINATOR, refused", a.Err, a.Refused())
	}
}
