package manifests_test

import (
	"os"
	"strings"
	"testing"

	"github.com/tidemark/tidemark/tools/manifests"
)

const composeFile = "../../docker-compose.yml"

func TestCompose(t *testing.T) {
	for _, vars := range []map[string]string{
		nil, // the defaults
		{"TIDEMARK_KAFKA_PORT": "29192", "TIDEMARK_PG_PORT": "25432"},
	} {
		c, err := manifests.LoadCompose(composeFile, vars)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.CheckOrders("orders"); err != nil {
			t.Errorf("with %v: %v", vars, err)
		}
		if err := c.CheckTopicJob("orders-topic"); err != nil {
			t.Errorf("with %v: %v", vars, err)
		}
		if got := c.Services["orders"].DependsOn["orders-topic"]; got != "service_completed_successfully" {
			t.Errorf("services.orders: depends_on.orders-topic %q, want service_completed_successfully (the service exits when its topic is missing)", got)
		}
	}
}

var composeMutations = []struct {
	name, old, new string
	want           []string
}{
	{"host address from the container", "TIDEMARK_KAFKA_BROKERS: kafka:9092", "TIDEMARK_KAFKA_BROKERS: 127.0.0.1:${TIDEMARK_KAFKA_PORT:-19092}",
		[]string{`services.orders: environment.TIDEMARK_KAFKA_BROKERS "127.0.0.1:19092"`, `no service named "127.0.0.1"`}},
	{"no such listener", "TIDEMARK_KAFKA_BROKERS: kafka:9092", "TIDEMARK_KAFKA_BROKERS: kafka:9093",
		[]string{"service kafka has no listener on port 9093"}},
	{"advertised for the host only", ",COMPOSE://kafka:9092\n", "\n",
		[]string{`listener COMPOSE advertises ""`}},
	{"advertised under another name", "COMPOSE://kafka:9092\n", "COMPOSE://broker:9092\n",
		[]string{`advertises "broker:9092" (KAFKA_ADVERTISED_LISTENERS), not "kafka:9092"`}},
	{"host network with a host-only broker", "    environment:\n      TIDEMARK_KAFKA_BROKERS: kafka:9092", "    network_mode: host\n    environment:\n      TIDEMARK_KAFKA_BROKERS: kafka:9092",
		[]string{"with network_mode host the broker is on 127.0.0.1, not kafka"}},
	{"database host", "@postgres:5432/", "@db:5432/",
		[]string{`TIDEMARK_PG_DSN host "db:5432"`}},
	{"database port", "@postgres:5432/", "@postgres:15432/",
		[]string{"service postgres listens on 5432 in its container, not 15432"}},
	{"no health wait", "      kafka: {condition: service_healthy}\n      postgres", "      kafka: {condition: service_started}\n      postgres",
		[]string{"depends_on.kafka: want condition service_healthy"}},
	{"stop grace short", "stop_grace_period: 25s", "stop_grace_period: 15s",
		[]string{"stop_grace_period 15s < TIDEMARK_SHUTDOWN_BUDGET 20s"}},
	{"stop grace without the margin", "stop_grace_period: 25s", "stop_grace_period: 21s",
		[]string{"stop_grace_period 21s < TIDEMARK_SHUTDOWN_BUDGET 20s + 2s margin"}},
	{"stop grace default", "    stop_grace_period: 25s\n", "",
		[]string{"stop_grace_period 10s < TIDEMARK_SHUTDOWN_BUDGET 20s"}},
	{"listening on the container's loopback", `ORDERS_HTTP: ":8080"`, `ORDERS_HTTP: "127.0.0.1:8080"`,
		[]string{`environment.ORDERS_HTTP "127.0.0.1:8080"`}},
	{"COMPOSE listener bound to the broker's loopback", "COMPOSE://:9092", "COMPOSE://localhost:9092",
		[]string{`service kafka's listener COMPOSE is bound to "localhost", its own container's loopback`}},
	{"COMPOSE listener bound to 127.0.0.1", "COMPOSE://:9092", "COMPOSE://127.0.0.1:9092",
		[]string{`listener COMPOSE is bound to "127.0.0.1"`}},
	{"COMPOSE listener missing from the protocol map", "PLAINTEXT:PLAINTEXT,COMPOSE:PLAINTEXT,CONTROLLER:PLAINTEXT", "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
		[]string{"listener COMPOSE has no security protocol", "Kafka refuses to start"}},
	{"COMPOSE listener over TLS", "COMPOSE:PLAINTEXT", "COMPOSE:SSL",
		[]string{"listener COMPOSE is SSL", "the example connects in PLAINTEXT"}},
	{"listening on the IPv6 loopback", `ORDERS_HTTP: ":8080"`, `ORDERS_HTTP: "[::1]:8080"`,
		[]string{`environment.ORDERS_HTTP "[::1]:8080"`}},
	{"listening on 127.0.0.2", `ORDERS_HTTP: ":8080"`, `ORDERS_HTTP: "127.0.0.2:8080"`,
		[]string{`environment.ORDERS_HTTP "127.0.0.2:8080"`}},
	{"published port elsewhere", `:8080"` + "\n    environment:", `:9090"` + "\n    environment:",
		[]string{"the container port is not 8080"}},
}

func TestComposeTopicJobMutations(t *testing.T) {
	base, err := os.ReadFile(composeFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []struct{ name, old, new, want string }{
		{"host address", `["-brokers", "kafka:9092"`, `["-brokers", "127.0.0.1:19092"`, `services.orders-topic: command -brokers "127.0.0.1:19092"`},
		{"no health wait", "    depends_on:\n      kafka: {condition: service_healthy}\n\n", "    depends_on:\n      kafka: {condition: service_started}\n\n", "services.orders-topic: depends_on.kafka"},
		{"no brokers", `["-brokers", "kafka:9092", `, `[`, "command has no -brokers argument"},
	} {
		t.Run(m.name, func(t *testing.T) {
			c, err := manifests.DecodeCompose(edit(t, base, m.old, m.new), nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := c.CheckTopicJob("orders-topic"); err == nil || !strings.Contains(err.Error(), m.want) {
				t.Fatalf("want an error naming %q, got %v", m.want, err)
			}
		})
	}
}

func TestComposeMutations(t *testing.T) {
	base, err := os.ReadFile(composeFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range composeMutations {
		t.Run(m.name, func(t *testing.T) {
			c, err := manifests.DecodeCompose(edit(t, base, m.old, m.new), nil)
			if err != nil {
				t.Fatal(err)
			}
			err = c.CheckOrders("orders")
			if err == nil {
				t.Fatalf("no error; want one naming %q", m.want)
			}
			for _, w := range m.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not name %q:\n%v", w, err)
				}
			}
		})
	}
}
