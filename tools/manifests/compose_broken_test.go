package manifests_test

import (
	"os"
	"testing"

	"github.com/tidemark/tidemark/tools/manifests"
)

// TestComposeBrokenBroker: edits of docker-compose.yml that
// leave the orders service unable to reach the broker or be reached, and
// that CheckOrders must refuse (it once accepted them).
func TestComposeBrokenBroker(t *testing.T) {
	base, err := os.ReadFile(composeFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []struct{ name, why, old, new string }{
		{"COMPOSE listener bound to the broker's loopback",
			"the broker listens on 127.0.0.1 of its own container: the orders container's connection to kafka:9092 is refused",
			"COMPOSE://:9092", "COMPOSE://localhost:9092"},
		{"COMPOSE listener missing from the protocol map",
			"Kafka refuses to start: no security protocol for listener COMPOSE (KAFKA_LISTENER_SECURITY_PROTOCOL_MAP)",
			"PLAINTEXT:PLAINTEXT,COMPOSE:PLAINTEXT,CONTROLLER:PLAINTEXT", "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"},
		{"ORDERS_HTTP on the IPv6 loopback",
			"the container's loopback cannot be reached through a published port (the check refuses 127.0.0.1 and localhost only)",
			`ORDERS_HTTP: ":8080"`, `ORDERS_HTTP: "[::1]:8080"`},
	} {
		t.Run(m.name, func(t *testing.T) {
			c, err := manifests.DecodeCompose(edit(t, base, m.old, m.new), nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := c.CheckOrders("orders"); err == nil {
				t.Fatalf("CheckOrders accepts %q -> %q; want an error: %s", m.old, m.new, m.why)
			}
		})
	}
}
