package kgocontact_test

import (
	"bytes"
	"net"
	"sync"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tidemark/tidemark/internal/kgocontact"
)

// fastBroker is a net.Conn whose broker answers a request as soon as its
// bytes reach the socket, before the client's Write call has returned:
// what a client sees when the goroutine that wrote is descheduled right
// after the write syscall while another goroutine reads the connection.
// kafka-go does that on a consumer group's connection: Conn.doRequest
// (heartbeat loop) and Conn.waitResponse (a commit, the partition
// watcher) run concurrently under separate locks, and waitResponse's
// bufio.Reader reads ahead whatever has arrived.
type fastBroker struct {
	net.Conn
	answer  []byte
	mu      sync.Mutex
	r       bytes.Buffer
	arrived chan struct{} // closed when the answer is readable
	release chan struct{} // the writer's Write returns once closed
}

func (c *fastBroker) Write(b []byte) (int, error) {
	c.mu.Lock()
	c.r.Write(c.answer)
	c.mu.Unlock()
	close(c.arrived)
	<-c.release
	return len(b), nil
}

func (c *fastBroker) Read(b []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.r.Read(b)
}

// TestWatchConnAnswerBeforeWriteReturns: a heartbeat answered before the
// Write that sent it returned is still the coordinator's answer. WatchConn
// notes the request only after the underlying Write returns, so the
// answer finds no pending request, and the connection stops being
// watched for good: its member then looks cut off from the coordinator
// (not ready after the contact limit) while it heartbeats fine.
func TestWatchConnAnswerBeforeWriteReturns(t *testing.T) {
	hb := kmsg.NewPtrHeartbeatRequest()
	hb.SetVersion(0) // kafka-go's
	hbr := hb.ResponseKind()
	hbr.SetVersion(0)
	fb := &fastBroker{answer: response(hbr, 1), arrived: make(chan struct{}), release: make(chan struct{})}
	var mu sync.Mutex
	var got []kgocontact.Answer
	c := kgocontact.WatchConn(fb, func(a kgocontact.Answer) {
		mu.Lock()
		got = append(got, a)
		mu.Unlock()
	})
	wrote := make(chan error, 1)
	go func() {
		_, err := c.Write(request(hb, 1))
		wrote <- err
	}()
	<-fb.arrived
	buf := make([]byte, 4096) // kafka-go's bufio.Reader size
	for n, _ := c.Read(buf); n > 0; n, _ = c.Read(buf) {
	}
	close(fb.release)
	if err := <-wrote; err != nil {
		t.Fatal(err)
	}
	// The next heartbeat, answered after its Write returned.
	fb2 := fb
	fb2.arrived, fb2.release = make(chan struct{}), make(chan struct{})
	close(fb2.release)
	if _, err := c.Write(request(hb, 2)); err != nil {
		t.Fatal(err)
	}
	for n, _ := c.Read(buf); n > 0; n, _ = c.Read(buf) {
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 2 {
		t.Fatalf("%d heartbeat answers reported (%+v), want 2: an answer read before its Write returned stopped the watch of the connection", len(got), got)
	}
}
