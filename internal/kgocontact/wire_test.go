package kgocontact_test

import (
	"bytes"
	"encoding/binary"
	"net"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tidemark/tidemark/internal/kgocontact"
)

// pipeConn is a net.Conn that keeps what is written and reads what the
// test queued.
type pipeConn struct {
	net.Conn
	w, r bytes.Buffer
}

func (c *pipeConn) Write(b []byte) (int, error) { return c.w.Write(b) }
func (c *pipeConn) Read(b []byte) (int, error)  { return c.r.Read(b) }

// request frames req as a client would: size, key, version, correlation
// id, client id, tagged fields if flexible, body.
func request(req kmsg.Request, corr int32) []byte {
	b := binary.BigEndian.AppendUint16(nil, uint16(req.Key()))
	b = binary.BigEndian.AppendUint16(b, uint16(req.GetVersion()))
	b = binary.BigEndian.AppendUint32(b, uint32(corr))
	b = binary.BigEndian.AppendUint16(b, 0xffff) // null client id
	if req.IsFlexible() {
		b = append(b, 0)
	}
	b = req.AppendTo(b)
	return append(binary.BigEndian.AppendUint32(nil, uint32(len(b))), b...)
}

// response frames resp as a broker would.
func response(resp kmsg.Response, corr int32) []byte {
	b := binary.BigEndian.AppendUint32(nil, uint32(corr))
	if resp.IsFlexible() {
		b = append(b, 0)
	}
	b = resp.AppendTo(b)
	return append(binary.BigEndian.AppendUint32(nil, uint32(len(b))), b...)
}

// TestWatchConn: only answers to coordinator requests are reported, each
// with its group-level error and member epoch, however the frames are cut
// into writes and reads.
func TestWatchConn(t *testing.T) {
	fc := kmsg.NewPtrFindCoordinatorRequest()
	fc.SetVersion(4)
	fcr := fc.ResponseKind().(*kmsg.FindCoordinatorResponse)
	fcr.SetVersion(4)

	hb := kmsg.NewPtrHeartbeatRequest()
	hb.SetVersion(4)
	hbOK := hb.ResponseKind().(*kmsg.HeartbeatResponse)
	hbOK.SetVersion(4)
	hbRebalance := hb.ResponseKind().(*kmsg.HeartbeatResponse)
	hbRebalance.SetVersion(4)
	hbRebalance.ErrorCode = kerr.RebalanceInProgress.Code
	hbOld := kmsg.NewPtrHeartbeatRequest()
	hbOld.SetVersion(0)
	hbNotCoord := hbOld.ResponseKind().(*kmsg.HeartbeatResponse)
	hbNotCoord.SetVersion(0)
	hbNotCoord.ErrorCode = kerr.NotCoordinator.Code

	sgh := kmsg.NewPtrShareGroupHeartbeatRequest()
	sgh.SetVersion(1)
	sghRefused := sgh.ResponseKind().(*kmsg.ShareGroupHeartbeatResponse)
	sghRefused.SetVersion(1)
	sghRefused.ErrorCode = kerr.GroupAuthorizationFailed.Code
	sghOK := sgh.ResponseKind().(*kmsg.ShareGroupHeartbeatResponse)
	sghOK.SetVersion(1)
	sghOK.MemberEpoch = 3

	oc := kmsg.NewPtrOffsetCommitRequest()
	oc.SetVersion(8)
	ocr := oc.ResponseKind().(*kmsg.OffsetCommitResponse)
	ocr.SetVersion(8)
	topic := kmsg.NewOffsetCommitResponseTopic()
	topic.Topic = "t"
	part := kmsg.NewOffsetCommitResponseTopicPartition()
	part.ErrorCode = kerr.NotCoordinator.Code
	topic.Partitions = append(topic.Partitions, part)
	ocr.Topics = append(ocr.Topics, topic)
	// A partition's own error, not the group's: not Err, but PartErr.
	ocrPart := oc.ResponseKind().(*kmsg.OffsetCommitResponse)
	ocrPart.SetVersion(8)
	ptopic := kmsg.NewOffsetCommitResponseTopic()
	ptopic.Topic = "t"
	ok, tooLarge := kmsg.NewOffsetCommitResponseTopicPartition(), kmsg.NewOffsetCommitResponseTopicPartition()
	tooLarge.Partition, tooLarge.ErrorCode = 1, kerr.OffsetMetadataTooLarge.Code
	ptopic.Partitions = append(ptopic.Partitions, ok, tooLarge)
	ocrPart.Topics = append(ocrPart.Topics, ptopic)

	exchanges := []struct {
		req  kmsg.Request
		resp kmsg.Response
	}{{fc, fcr}, {hb, hbOK}, {hb, hbRebalance}, {hbOld, hbNotCoord}, {sgh, sghRefused}, {sgh, sghOK}, {fc, fcr}, {oc, ocr}, {oc, ocrPart}}
	want := []struct {
		key     kmsg.Key
		err     error
		refused bool
		epoch   int32
		partErr error
	}{
		{kmsg.Heartbeat, nil, false, -1, nil},
		{kmsg.Heartbeat, kerr.RebalanceInProgress, false, -1, nil},
		{kmsg.Heartbeat, kerr.NotCoordinator, true, -1, nil},
		{kmsg.ShareGroupHeartbeat, kerr.GroupAuthorizationFailed, true, 0, nil},
		{kmsg.ShareGroupHeartbeat, nil, false, 3, nil},
		{kmsg.OffsetCommit, kerr.NotCoordinator, true, -1, kerr.NotCoordinator},
		{kmsg.OffsetCommit, nil, false, -1, kerr.OffsetMetadataTooLarge},
	}
	for _, step := range []int{1, 3, 1 << 20} {
		var got []kgocontact.Answer
		pc := &pipeConn{}
		c := kgocontact.WatchConn(pc, func(a kgocontact.Answer) { got = append(got, a) })
		var reqs, resps []byte
		for i, x := range exchanges {
			reqs = append(reqs, request(x.req, int32(i))...)
			resps = append(resps, response(x.resp, int32(i))...)
		}
		for b := reqs; len(b) > 0; b = b[min(step, len(b)):] {
			if _, err := c.Write(b[:min(step, len(b))]); err != nil {
				t.Fatal(err)
			}
		}
		pc.r.Write(resps)
		for buf := make([]byte, step); ; {
			if n, _ := c.Read(buf); n == 0 {
				break
			}
		}
		if len(got) != len(want) {
			t.Fatalf("step %d: %d answers reported (%+v), want %d: the FindCoordinator answers must not count", step, len(got), got, len(want))
		}
		for i, w := range want {
			a := got[i]
			if kmsg.Key(a.Key) != w.key || a.Err != w.err || a.Refused() != w.refused || a.Epoch != w.epoch || a.PartErr != w.partErr || !a.Decoded {
				t.Errorf("step %d, answer %d: %v err %v refused %v epoch %d partition error %v decoded %v; want %v %v %v %d %v true",
					step, i, kmsg.Key(a.Key), a.Err, a.Refused(), a.Epoch, a.PartErr, a.Decoded, w.key, w.err, w.refused, w.epoch, w.partErr)
			}
		}
	}
}

// TestWatchConnProduceStops: a connection that produces is not tracked
// (an acks=0 produce has no answer to pair with): nothing read on it after
// is reported.
func TestWatchConnProduceStops(t *testing.T) {
	pr := kmsg.NewPtrProduceRequest()
	pr.SetVersion(9)
	pr.Acks = 0
	hb := kmsg.NewPtrHeartbeatRequest()
	hb.SetVersion(4)
	hbr := hb.ResponseKind()
	hbr.SetVersion(4)
	pc := &pipeConn{}
	reported := 0
	c := kgocontact.WatchConn(pc, func(kgocontact.Answer) { reported++ })
	for _, b := range [][]byte{request(pr, 0), request(hb, 1)} {
		if _, err := c.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	pc.r.Write(response(hbr, 1))
	buf := make([]byte, 64)
	for n, _ := c.Read(buf); n > 0; n, _ = c.Read(buf) {
	}
	if reported != 0 {
		t.Fatalf("%d answers reported on a connection that produced acks=0, want 0 (the answer cannot be paired)", reported)
	}
}
