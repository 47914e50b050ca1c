package share_test

import (
	"sync/atomic"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/pkg/source/share"
)

// countClients is a user's hook that counts the clients it is told of, as
// a metrics plugin does to register and unregister a client's metrics.
type countClients struct{ created, closed atomic.Int32 }

func (h *countClients) OnNewClient(*kgo.Client)    { h.created.Add(1) }
func (h *countClients) OnClientClosed(*kgo.Client) { h.closed.Add(1) }

// TestNewClientsSeenByHooks: the hooks a user gives in ClientOptions see
// only the sessions' clients. New builds a throwaway client per session
// from the user's options to read its dialer (kgocontact.WireOptions),
// and that client's creation and close reach the user's hooks too.
func TestNewClientsSeenByHooks(t *testing.T) {
	h := &countClients{}
	src, err := share.New([]string{"127.0.0.1:1"}, "g", []string{"t"}, share.Sessions(2), share.ClientOptions(kgo.WithHooks(h)))
	if err != nil {
		t.Fatal(err)
	}
	created := h.created.Load()
	src.Close()
	if created != 2 {
		t.Errorf("the user's hook saw %d clients created by New with 2 sessions (%d closed by Close), want 2", created, h.closed.Load())
	}
}
