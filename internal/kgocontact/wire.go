package kgocontact

import (
	"encoding/binary"
	"net"
	"sync"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Answer is one response a watched connection read to a request only a
// group's coordinator answers (JoinGroup, SyncGroup, Heartbeat, LeaveGroup,
// OffsetCommit, OffsetFetch, ConsumerGroupHeartbeat, ShareGroupHeartbeat).
type Answer struct {
	// Key and Version are the request's API key and version.
	Key, Version int16
	// Err is the response's group-level error (kerr), nil if none or if
	// the response could not be decoded.
	Err error
	// Epoch is the member epoch of a ConsumerGroupHeartbeat or
	// ShareGroupHeartbeat answer, -1 for any other.
	Epoch int32
	// PartErr is the first per-partition error of an OffsetCommit answer,
	// group-level or not (Err has only the group-level ones), nil if none.
	PartErr error
	// Decoded reports whether the response could be decoded; when it
	// could not, Err and PartErr say nothing.
	Decoded bool
}

// Refused reports whether the answer is the coordinator declining the
// member rather than serving it: any group-level error but
// REBALANCE_IN_PROGRESS and MEMBER_ID_REQUIRED, which are how a coordinator
// runs a classic rebalance.
func (a Answer) Refused() bool {
	return a.Err != nil && a.Err != kerr.RebalanceInProgress && a.Err != kerr.MemberIDRequired
}

// groupLevel is the set of per-partition error codes of an OffsetCommit or
// OffsetFetch answer that are about the group, not the partition.
func groupLevel(code int16) bool {
	switch kerr.ErrorForCode(code) {
	case kerr.NotCoordinator, kerr.CoordinatorNotAvailable, kerr.CoordinatorLoadInProgress,
		kerr.GroupAuthorizationFailed, kerr.IllegalGeneration, kerr.UnknownMemberID,
		kerr.FencedInstanceID, kerr.StaleMemberEpoch, kerr.GroupIDNotFound, kerr.InvalidGroupID,
		kerr.RebalanceInProgress:
		return true
	}
	return false
}

// WatchConn returns c with its Kafka frames watched: the API key of each
// request written, and for each response read to a coordinator request,
// onAnswer (called on the reading goroutine, before the client sees the
// response). Kafka answers a connection's requests in order, so the n-th
// response is the n-th request's. c must carry the plain Kafka protocol
// (below it TLS, never above). A connection that produces is not tracked
// (an acks=0 produce has no answer to pair), nor one whose frames do not
// parse: both then report nothing.
func WatchConn(c net.Conn, onAnswer func(Answer)) net.Conn {
	return &wireConn{Conn: c, onAnswer: onAnswer}
}

type wireConn struct {
	net.Conn
	onAnswer func(Answer)

	mu      sync.Mutex
	off     bool       // stopped tracking
	pending [][2]int16 // key, version of the requests not answered yet

	// Write side (one writer at a time: a client serialises its writes).
	whdr  [8]byte
	whn   int
	wleft int // bytes of the current request still to pass

	// Read side.
	rhdr  [4]byte
	rhn   int
	rleft int    // bytes of the current response still to read
	rbody []byte // the current response, kept when it answers a coordinator request
	rkeep bool
	rreq  [2]int16
}

func (c *wireConn) stop() {
	c.mu.Lock()
	c.off, c.pending = true, nil
	c.mu.Unlock()
}

func (c *wireConn) stopped() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.off
}

func (c *wireConn) Write(b []byte) (int, error) {
	// Note the requests before they go out: their answers may be read
	// (by another goroutine) before the underlying Write returns. A
	// short write fails the connection, so b is noted whole.
	if !c.stopped() {
		c.wrote(b)
	}
	return c.Conn.Write(b)
}

func (c *wireConn) wrote(b []byte) {
	for len(b) > 0 {
		if c.wleft > 0 {
			k := min(c.wleft, len(b))
			c.wleft -= k
			b = b[k:]
			continue
		}
		k := copy(c.whdr[c.whn:], b)
		c.whn += k
		b = b[k:]
		if c.whn < len(c.whdr) {
			return
		}
		c.whn = 0
		size := int32(binary.BigEndian.Uint32(c.whdr[0:4]))
		key := int16(binary.BigEndian.Uint16(c.whdr[4:6]))
		ver := int16(binary.BigEndian.Uint16(c.whdr[6:8]))
		if size < 4 || key == int16(kmsg.Produce) {
			c.stop()
			return
		}
		c.wleft = int(size) - 4
		c.mu.Lock()
		if c.off {
			c.mu.Unlock()
			return
		}
		c.pending = append(c.pending, [2]int16{key, ver})
		c.mu.Unlock()
	}
}

func (c *wireConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if !c.stopped() {
		c.read(b[:n])
	}
	return n, err
}

func (c *wireConn) read(b []byte) {
	for len(b) > 0 {
		if c.rleft > 0 {
			k := min(c.rleft, len(b))
			if c.rkeep {
				c.rbody = append(c.rbody, b[:k]...)
			}
			c.rleft -= k
			b = b[k:]
			if c.rleft == 0 && c.rkeep {
				c.answered(c.rreq[0], c.rreq[1], c.rbody)
				c.rbody, c.rkeep = c.rbody[:0], false
			}
			continue
		}
		k := copy(c.rhdr[c.rhn:], b)
		c.rhn += k
		b = b[k:]
		if c.rhn < len(c.rhdr) {
			return
		}
		c.rhn = 0
		size := int32(binary.BigEndian.Uint32(c.rhdr[:]))
		c.mu.Lock()
		if c.off || len(c.pending) == 0 || size < 4 {
			c.mu.Unlock()
			c.stop()
			return
		}
		c.rreq = c.pending[0]
		c.pending = c.pending[1:]
		c.mu.Unlock()
		c.rleft, c.rkeep = int(size), coordinatorRequest(c.rreq[0])
	}
}

// answered decodes a response (correlation id, header, body) to a
// coordinator request and reports it.
func (c *wireConn) answered(key, ver int16, frame []byte) {
	a := Answer{Key: key, Version: ver, Epoch: -1}
	defer func() { c.onAnswer(a) }()
	req := kmsg.RequestForKey(key)
	if req == nil || len(frame) < 4 {
		return
	}
	req.SetVersion(ver)
	body := frame[4:] // the correlation id
	if req.IsFlexible() {
		tags, k := binary.Uvarint(body)
		if k <= 0 {
			return
		}
		body = body[k:]
		for range tags {
			_, k := binary.Uvarint(body) // tag
			if k <= 0 {
				return
			}
			body = body[k:]
			size, k := binary.Uvarint(body)
			if k <= 0 || uint64(len(body)-k) < size {
				return
			}
			body = body[k+int(size):]
		}
	}
	resp := req.ResponseKind()
	resp.SetVersion(ver)
	if resp.ReadFrom(body) != nil {
		return
	}
	a.Decoded = true
	code := int16(0)
	switch r := resp.(type) {
	case *kmsg.JoinGroupResponse:
		code = r.ErrorCode
	case *kmsg.SyncGroupResponse:
		code = r.ErrorCode
	case *kmsg.HeartbeatResponse:
		code = r.ErrorCode
	case *kmsg.LeaveGroupResponse:
		code = r.ErrorCode
	case *kmsg.ConsumerGroupHeartbeatResponse:
		code, a.Epoch = r.ErrorCode, r.MemberEpoch
	case *kmsg.ShareGroupHeartbeatResponse:
		code, a.Epoch = r.ErrorCode, r.MemberEpoch
	case *kmsg.OffsetCommitResponse:
		code = firstGroupLevel(r)
		a.PartErr = firstPartitionError(r)
	case *kmsg.OffsetFetchResponse:
		// Before v2 there is no top-level code: the broker puts a group
		// error on each partition, as OffsetCommit's answer does.
		code = r.ErrorCode
		for _, g := range r.Groups {
			if code == 0 {
				code = g.ErrorCode
			}
		}
		for _, t := range r.Topics {
			for _, p := range t.Partitions {
				if code == 0 && p.ErrorCode != 0 && groupLevel(p.ErrorCode) {
					code = p.ErrorCode
				}
			}
		}
	}
	a.Err = kerr.ErrorForCode(code)
}

// firstPartitionError returns the first error of an OffsetCommit answer's
// partitions, nil if none.
func firstPartitionError(r *kmsg.OffsetCommitResponse) error {
	for _, t := range r.Topics {
		for _, p := range t.Partitions {
			if p.ErrorCode != 0 {
				return kerr.ErrorForCode(p.ErrorCode)
			}
		}
	}
	return nil
}

// firstGroupLevel returns the first group-level error code of an
// OffsetCommit answer's partitions, 0 if none.
func firstGroupLevel(r *kmsg.OffsetCommitResponse) int16 {
	for _, t := range r.Topics {
		for _, p := range t.Partitions {
			if p.ErrorCode != 0 && groupLevel(p.ErrorCode) {
				return p.ErrorCode
			}
		}
	}
	return 0
}
