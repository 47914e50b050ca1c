package manifests_test

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/tidemark/tidemark/tools/manifests"
)

const kitDir = "../../examples/orders/k8s"

// readKit reads the kit's files, file name → content.
func readKit(t *testing.T) map[string][]byte {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(kitDir, "*.yaml"))
	if err != nil || len(names) == 0 {
		t.Fatalf("no manifests in %s: %v", kitDir, err)
	}
	files := map[string][]byte{}
	for _, n := range names {
		b, err := os.ReadFile(n)
		if err != nil {
			t.Fatal(err)
		}
		files[filepath.Base(n)] = b
	}
	return files
}

func TestOrdersKit(t *testing.T) {
	k, err := manifests.LoadDir(kitDir)
	if err != nil {
		t.Fatalf("decoding %s: %v", kitDir, err)
	}
	if len(k.StatefulSets) != 1 || len(k.Services) != 1 || len(k.ConfigMaps) != 1 || len(k.PDBs) != 1 {
		t.Fatalf("want one StatefulSet, Service, ConfigMap and PodDisruptionBudget; have %d, %d, %d, %d",
			len(k.StatefulSets), len(k.Services), len(k.ConfigMaps), len(k.PDBs))
	}
	if err := k.Check(manifests.OrdersSizing); err != nil {
		t.Fatalf("the kit's numbers disagree:\n%v", err)
	}
}

// mutation is one edit of one file of the kit, and what the check must
// then say.
type mutation struct {
	name     string
	file     string
	old, new string
	// A second edit, made first, when one is not enough.
	file2, old2, new2 string
	decodeErr         bool     // the edit must fail decoding, not the checks
	wantInErrs        []string // each must appear in the error
}

var kitMutations = []mutation{
	// Strict decoding.
	{name: "unknown field", file: "statefulset.yaml", old: "  podManagementPolicy: Parallel\n", new: "  podManagementPolicy: Parallel\n  restartPolicy: Always\n",
		decodeErr: true, wantInErrs: []string{"statefulset.yaml", `unknown field "spec.restartPolicy"`}},
	{name: "field in the wrong case", file: "statefulset.yaml", old: "  serviceName: orders", new: "  ServiceName: orders",
		decodeErr: true, wantInErrs: []string{"statefulset.yaml", `unknown field "spec.ServiceName"`}},
	{name: "duplicate key", file: "configmap.yaml", old: `  ORDERS_TOPIC: "orders"`, new: "  ORDERS_TOPIC: \"orders\"\n  ORDERS_TOPIC: \"other\"",
		decodeErr: true, wantInErrs: []string{"configmap.yaml", "ORDERS_TOPIC"}},
	{name: "unknown kind", file: "pdb.yaml", old: "kind: PodDisruptionBudget", new: "kind: PodDisruptionBudgets",
		decodeErr: true, wantInErrs: []string{"pdb.yaml", `kind "PodDisruptionBudgets"`}},
	{name: "old api version", file: "pdb.yaml", old: "apiVersion: policy/v1", new: "apiVersion: policy/v1beta1",
		decodeErr: true, wantInErrs: []string{"pdb.yaml", `"policy/v1beta1"`}},
	{name: "wrong value type", file: "statefulset.yaml", old: "terminationGracePeriodSeconds: 25", new: "terminationGracePeriodSeconds: 25s",
		decodeErr: true, wantInErrs: []string{"statefulset.yaml", "terminationGracePeriodSeconds"}},

	// Grace period ≥ preStop + shutdown budget.
	{name: "grace period short", file: "statefulset.yaml", old: "terminationGracePeriodSeconds: 25", new: "terminationGracePeriodSeconds: 22",
		wantInErrs: []string{"terminationGracePeriodSeconds 22", "preStop 3s", "TIDEMARK_SHUTDOWN_BUDGET 20s", "configmap.yaml"}},
	{name: "grace period with no margin", file: "statefulset.yaml", old: "terminationGracePeriodSeconds: 25", new: "terminationGracePeriodSeconds: 24",
		wantInErrs: []string{"terminationGracePeriodSeconds 24", "preStop 3s + TIDEMARK_SHUTDOWN_BUDGET 20s (configmap.yaml: ConfigMap orders data.TIDEMARK_SHUTDOWN_BUDGET) + 2s margin"}},
	{name: "budget grown", file: "configmap.yaml", old: `TIDEMARK_SHUTDOWN_BUDGET: "20s"`, new: `TIDEMARK_SHUTDOWN_BUDGET: "30s"`,
		wantInErrs: []string{"terminationGracePeriodSeconds 25", "TIDEMARK_SHUTDOWN_BUDGET 30s"}},
	{name: "budget unset: the default", file: "configmap.yaml", old: `  TIDEMARK_SHUTDOWN_BUDGET: "20s"`, new: ``}, // 25 ≥ 3 + 20 still holds with the default; the shorter grace
	// below shows that the default is what is compared.

	{name: "budget unset and grace short", file: "statefulset.yaml", old: "terminationGracePeriodSeconds: 25", new: "terminationGracePeriodSeconds: 22",
		file2: "configmap.yaml", old2: `  TIDEMARK_SHUTDOWN_BUDGET: "20s"`, new2: "",
		wantInErrs: []string{"terminationGracePeriodSeconds 22", "TIDEMARK_SHUTDOWN_BUDGET 20s (unset: the default)"}},
	{name: "budget overridden in env", file: "statefulset.yaml", old: "            - name: GOMEMLIMIT\n", new: "            - name: TIDEMARK_SHUTDOWN_BUDGET\n              value: 40s\n            - name: GOMEMLIMIT\n",
		wantInErrs: []string{"TIDEMARK_SHUTDOWN_BUDGET 40s", "env[TIDEMARK_SHUTDOWN_BUDGET]"}},
	{name: "budget not a duration", file: "configmap.yaml", old: `TIDEMARK_SHUTDOWN_BUDGET: "20s"`, new: `TIDEMARK_SHUTDOWN_BUDGET: "20"`,
		wantInErrs: []string{`TIDEMARK_SHUTDOWN_BUDGET="20"`, "not a positive duration"}},
	{name: "preStop grown", file: "statefulset.yaml", old: "sleep: {seconds: 3}", new: "sleep: {seconds: 10}",
		wantInErrs: []string{"preStop 10s"}},
	{name: "preStop exec", file: "statefulset.yaml", old: "sleep: {seconds: 3}", new: "exec: {command: [sleep, \"3\"]}",
		wantInErrs: []string{"lifecycle.preStop: only a sleep action"}},

	// Probes.
	{name: "probe on a port the container lacks", file: "statefulset.yaml", old: "httpGet: {path: /readyz, port: http}", new: "httpGet: {path: /readyz, port: metrics}",
		wantInErrs: []string{"readinessProbe.httpGet.port metrics is not a port of the container"}},
	{name: "probe by number, wrong", file: "statefulset.yaml", old: "            # because a handler or the database is slow.\n            httpGet: {path: /livez, port: http}", new: "            # because a handler or the database is slow.\n            httpGet: {path: /livez, port: 9090}",
		wantInErrs: []string{"livenessProbe.httpGet.port 9090 is not a port of the container"}},
	{name: "probe path", file: "statefulset.yaml", old: "            # because a handler or the database is slow.\n            httpGet: {path: /livez, port: http}", new: "            # because a handler or the database is slow.\n            httpGet: {path: /healthz, port: http}",
		wantInErrs: []string{`livenessProbe.httpGet.path "/healthz": want /livez`}},
	{name: "probes swapped", file: "statefulset.yaml", old: "httpGet: {path: /readyz, port: http}", new: "httpGet: {path: /livez, port: http}",
		wantInErrs: []string{`readinessProbe.httpGet.path "/livez": want /readyz`}},
	{name: "probe misspelt", file: "statefulset.yaml", old: "          readinessProbe:\n", new: "          terminationMessagePath: /dev/termination-log\n          readinessProbx:\n", decodeErr: true,
		wantInErrs: []string{`unknown field "spec.template.spec.containers[0].readinessProbx"`}},
	{name: "readiness probe removed", file: "statefulset.yaml", old: "          readinessProbe:\n            # Ready once the member has joined the group and got its\n            # assignment; unready while Kafka cannot be reached and while\n            # draining (see pdb.yaml for what that does to drains).\n            httpGet: {path: /readyz, port: http}\n            periodSeconds: 5\n            failureThreshold: 1\n", new: "",
		wantInErrs: []string{"readinessProbe is missing: want httpGet /readyz"}},
	{name: "startup probe path", file: "statefulset.yaml", old: "            # up to 30s): up to 60s before liveness counts.\n            httpGet: {path: /livez, port: http}", new: "            # up to 30s): up to 60s before liveness counts.\n            httpGet: {path: /readyz, port: http}",
		wantInErrs: []string{`startupProbe.httpGet.path "/readyz": want /livez`}},
	{name: "startup probe port", file: "statefulset.yaml", old: "            # up to 30s): up to 60s before liveness counts.\n            httpGet: {path: /livez, port: http}", new: "            # up to 30s): up to 60s before liveness counts.\n            httpGet: {path: /livez, port: 8081}",
		wantInErrs: []string{"startupProbe.httpGet.port 8081 is not a port of the container"}},
	{name: "readiness probe over HTTPS", file: "statefulset.yaml", old: "httpGet: {path: /readyz, port: http}", new: "httpGet: {path: /readyz, port: http, scheme: HTTPS}",
		wantInErrs: []string{"readinessProbe.httpGet.scheme HTTPS: the service serves plain HTTP"}},
	{name: "liveness probe host set", file: "statefulset.yaml", old: "            # because a handler or the database is slow.\n            httpGet: {path: /livez, port: http}", new: "            # because a handler or the database is slow.\n            httpGet: {path: /livez, port: http, host: 127.0.0.1}",
		wantInErrs: []string{`livenessProbe.httpGet.host "127.0.0.1"`}},
	{name: "probe scheme HTTP spelt out", file: "statefulset.yaml", old: "httpGet: {path: /readyz, port: http}", new: "httpGet: {path: /readyz, port: http, scheme: HTTP}"},
	{name: "service listens elsewhere", file: "configmap.yaml", old: `ORDERS_HTTP: ":8080"`, new: `ORDERS_HTTP: ":9090"`,
		wantInErrs: []string{"the service listens on 9090 (configmap.yaml: ConfigMap orders data.ORDERS_HTTP) and no container port is 9090"}},
	{name: "service listens on loopback only", file: "configmap.yaml", old: `ORDERS_HTTP: ":8080"`, new: `ORDERS_HTTP: "127.0.0.1:8080"`,
		wantInErrs: []string{`ORDERS_HTTP="127.0.0.1:8080" (configmap.yaml: ConfigMap orders data.ORDERS_HTTP): the kubelet probes the pod's IP`}},
	{name: "service listens on the IPv6 loopback", file: "configmap.yaml", old: `ORDERS_HTTP: ":8080"`, new: `ORDERS_HTTP: "[::1]:8080"`,
		wantInErrs: []string{`ORDERS_HTTP="[::1]:8080"`, "listen on every interface (:8080)"}},
	{name: "service listens on a host name", file: "configmap.yaml", old: `ORDERS_HTTP: ":8080"`, new: `ORDERS_HTTP: "orders:8080"`,
		wantInErrs: []string{`ORDERS_HTTP="orders:8080"`}},
	{name: "service listens on 0.0.0.0", file: "configmap.yaml", old: `ORDERS_HTTP: ":8080"`, new: `ORDERS_HTTP: "0.0.0.0:8080"`},
	{name: "service listens on [::]", file: "configmap.yaml", old: `ORDERS_HTTP: ":8080"`, new: `ORDERS_HTTP: "[::]:8080"`},
	{name: "ORDERS_HTTP empty: the default :8080", file: "configmap.yaml", old: `ORDERS_HTTP: ":8080"`, new: `ORDERS_HTTP: ""`},
	{name: "budget empty: the default", file: "configmap.yaml", old: `TIDEMARK_SHUTDOWN_BUDGET: "20s"`, new: `TIDEMARK_SHUTDOWN_BUDGET: ""`},
	{name: "budget empty and grace short", file: "statefulset.yaml", old: "terminationGracePeriodSeconds: 25", new: "terminationGracePeriodSeconds: 22",
		file2: "configmap.yaml", old2: `TIDEMARK_SHUTDOWN_BUDGET: "20s"`, new2: `TIDEMARK_SHUTDOWN_BUDGET: ""`,
		wantInErrs: []string{"TIDEMARK_SHUTDOWN_BUDGET 20s (configmap.yaml: ConfigMap orders data.TIDEMARK_SHUTDOWN_BUDGET empty: the default)"}},
	{name: "session empty: the example's 10s", file: "configmap.yaml", old: `ORDERS_SESSION_TIMEOUT: "45s"`, new: `ORDERS_SESSION_TIMEOUT: ""`,
		wantInErrs: []string{"ORDERS_SESSION_TIMEOUT 10s (configmap.yaml: ConfigMap orders data.ORDERS_SESSION_TIMEOUT empty: the default) < 30s"}},

	// Flags in args win over their variables (examples/orders
	// parseConfig).
	{name: "args override ORDERS_HTTP", file: "statefulset.yaml", old: "          image: tidemark-orders:latest\n", new: "          image: tidemark-orders:latest\n          args: [\"-http\", \":9090\"]\n",
		wantInErrs: []string{"the service listens on 9090 (statefulset.yaml: StatefulSet orders args -http) and no container port is 9090"}},
	{name: "args override ORDERS_HTTP, -flag=value", file: "statefulset.yaml", old: "          image: tidemark-orders:latest\n", new: "          image: tidemark-orders:latest\n          args: [\"--http=127.0.0.1:8080\"]\n",
		wantInErrs: []string{`ORDERS_HTTP="127.0.0.1:8080" (statefulset.yaml: StatefulSet orders args -http)`}},
	{name: "args override the session timeout", file: "statefulset.yaml", old: "          image: tidemark-orders:latest\n", new: "          image: tidemark-orders:latest\n          args: [\"-session-timeout\", \"10s\"]\n",
		wantInErrs: []string{"ORDERS_SESSION_TIMEOUT 10s (statefulset.yaml: StatefulSet orders args -session-timeout) < 30s"}},
	{name: "args give a shared instance id", file: "statefulset.yaml", old: "          image: tidemark-orders:latest\n", new: "          image: tidemark-orders:latest\n          args: [\"-instance-id\", \"orders\"]\n",
		wantInErrs: []string{"env[ORDERS_INSTANCE_ID] (statefulset.yaml: StatefulSet orders args -instance-id): want valueFrom.fieldRef metadata.name"}},
	{name: "args that agree", file: "statefulset.yaml", old: "          image: tidemark-orders:latest\n", new: "          image: tidemark-orders:latest\n          args: [\"-http\", \":8080\", \"-session-timeout=45s\", \"-concurrency\", \"32\"]\n"},
	{name: "args: empty -dsn falls back to the variable", file: "statefulset.yaml", old: "          image: tidemark-orders:latest\n", new: "          image: tidemark-orders:latest\n          args: [\"-dsn\", \"\"]\n"},
	{name: "args: empty -brokers wins over the variable", file: "statefulset.yaml", old: "          image: tidemark-orders:latest\n", new: "          image: tidemark-orders:latest\n          args: [\"-brokers\", \"\"]\n",
		wantInErrs: []string{"TIDEMARK_KAFKA_BROKERS is empty or unset (statefulset.yaml: StatefulSet orders args -brokers): examples/orders exits 2 without it"}},
	{name: "args: a flag the example lacks", file: "statefulset.yaml", old: "          image: tidemark-orders:latest\n", new: "          image: tidemark-orders:latest\n          args: [\"-port\", \"9090\"]\n",
		wantInErrs: []string{"args [\"-port\" \"9090\"]: flag provided but not defined: -port: examples/orders would exit 2"}},
	{name: "args: not a flag, the rest ignored", file: "statefulset.yaml", old: "          image: tidemark-orders:latest\n", new: "          image: tidemark-orders:latest\n          args: [\"orders\", \"-http\", \":9090\"]\n",
		wantInErrs: []string{`"orders" is not a flag: examples/orders ignores it and every argument after it`}},
	{name: "args: a $(VAR) reference", file: "statefulset.yaml", old: "          image: tidemark-orders:latest\n", new: "          image: tidemark-orders:latest\n          args: [\"-http\", \"$(POD_IP):8080\"]\n",
		wantInErrs: []string{"the kubelet expands $(VAR)"}},
	{name: "command set", file: "statefulset.yaml", old: "          image: tidemark-orders:latest\n", new: "          image: tidemark-orders:latest\n          command: [/bin/sh, -c, \"exec orders\"]\n",
		wantInErrs: []string{"command [\"/bin/sh\" \"-c\" \"exec orders\"]: the check reads the arguments of the image's entrypoint"}},

	// Without brokers or a database the example exits 2.
	{name: "database variable removed", file: "statefulset.yaml", old: "            - name: TIDEMARK_PG_DSN\n              valueFrom: {secretKeyRef: {name: orders-db, key: dsn}}\n", new: "",
		wantInErrs: []string{"TIDEMARK_PG_DSN is empty or unset (unset: the default): examples/orders exits 2 without it"}},
	{name: "brokers variable removed", file: "configmap.yaml", old: "  TIDEMARK_KAFKA_BROKERS: \"kafka:9092\"\n", new: "",
		wantInErrs: []string{"TIDEMARK_KAFKA_BROKERS is empty or unset (unset: the default): examples/orders exits 2 without it"}},
	{name: "brokers only commas", file: "configmap.yaml", old: `TIDEMARK_KAFKA_BROKERS: "kafka:9092"`, new: `TIDEMARK_KAFKA_BROKERS: " , "`,
		wantInErrs: []string{"TIDEMARK_KAFKA_BROKERS is empty or unset (configmap.yaml: ConfigMap orders data.TIDEMARK_KAFKA_BROKERS): examples/orders exits 2"}},
	{name: "database from args", file: "statefulset.yaml", old: "            - name: TIDEMARK_PG_DSN\n              valueFrom: {secretKeyRef: {name: orders-db, key: dsn}}\n", new: "",
		file2: "statefulset.yaml", old2: "          image: tidemark-orders:latest\n", new2: "          image: tidemark-orders:latest\n          args: [\"-dsn\", \"postgres://db/orders\"]\n"},
	{name: "container port moved", file: "statefulset.yaml", old: "{name: http, containerPort: 8080}", new: "{name: http, containerPort: 8081}",
		wantInErrs: []string{"no container port is 8080", "prometheus.io/port] 8080: not the container port /metrics is served on"}},

	{name: "port name longer than 15", file: "statefulset.yaml", old: "{name: http, containerPort: 8080}", new: "{name: http, containerPort: 8080}\n            - {name: prometheus-metrics, containerPort: 9100}",
		wantInErrs: []string{`ports[1].name "prometheus-metrics": not an IANA_SVC_NAME`}},
	{name: "port name not an IANA_SVC_NAME", file: "statefulset.yaml", old: "{name: http, containerPort: 8080}", new: "{name: http, containerPort: 8080}\n            - {name: Debug_Port, containerPort: 6060}",
		wantInErrs: []string{`ports[1].name "Debug_Port": not an IANA_SVC_NAME`}},
	{name: "service port name not a DNS label", file: "service.yaml", old: "{name: http, port: 8080", new: "{name: HTTP, port: 8080",
		wantInErrs: []string{`Service orders: spec.ports[0].name "HTTP": not a DNS label`}},
	{name: "service targetPort names no container port", file: "service.yaml", old: "targetPort: http", new: "targetPort: metrics",
		wantInErrs: []string{"Service orders: spec.ports[0].targetPort metrics: not a port of container orders"}},
	{name: "service targetPort by number", file: "service.yaml", old: "targetPort: http", new: "targetPort: 8080"},
	{name: "service targetPort unset: the port, which is no container port", file: "service.yaml", old: "{name: http, port: 8080, targetPort: http}", new: "{name: http, port: 80}",
		wantInErrs: []string{"spec.ports[0].targetPort 80: not a port of container orders"}},

	// Scrape annotations.
	{name: "scrape port", file: "statefulset.yaml", old: `prometheus.io/port: "8080"`, new: `prometheus.io/port: "9090"`,
		wantInErrs: []string{"annotations[prometheus.io/port] 9090: not the container port /metrics is served on (ORDERS_HTTP 8080"}},
	{name: "scrape off", file: "statefulset.yaml", old: `prometheus.io/scrape: "true"`, new: `prometheus.io/scrape: "false"`,
		wantInErrs: []string{"annotations[prometheus.io/scrape]"}},
	{name: "scrape path", file: "statefulset.yaml", old: "prometheus.io/path: /metrics", new: "prometheus.io/path: /metricz",
		wantInErrs: []string{"annotations[prometheus.io/path]"}},

	// Selectors and the headless Service.
	{name: "service selector", file: "service.yaml", old: "selector: {app: orders}", new: "selector: {app: order}",
		wantInErrs: []string{"service.yaml: Service orders: spec.selector"}},
	{name: "service not headless", file: "service.yaml", old: "  clusterIP: None\n", new: "",
		wantInErrs: []string{"spec.clusterIP", "headless"}},
	{name: "serviceName names no Service", file: "statefulset.yaml", old: "serviceName: orders", new: "serviceName: orders-headless",
		wantInErrs: []string{`spec.serviceName "orders-headless": no Service`}},
	{name: "pdb selector", file: "pdb.yaml", old: "matchLabels: {app: orders}", new: "matchLabels: {app: orders, tier: web}",
		wantInErrs: []string{"pdb.yaml: PodDisruptionBudget orders: spec.selector"}},
	{name: "pdb blocks every drain", file: "pdb.yaml", old: "maxUnavailable: 1", new: "maxUnavailable: 0",
		wantInErrs: []string{"spec.maxUnavailable 0"}},
	{name: "pdb minAvailable and maxUnavailable", file: "pdb.yaml", old: "  maxUnavailable: 1\n", new: "  maxUnavailable: 1\n  minAvailable: 2\n",
		wantInErrs: []string{"spec.minAvailable and spec.maxUnavailable are both set"}},
	{name: "pdb percentage: 50% of 3 is 2", file: "pdb.yaml", old: "maxUnavailable: 1", new: `maxUnavailable: "50%"`},
	{name: "pdb percentage: 1% of 3 rounds up to 1", file: "pdb.yaml", old: "maxUnavailable: 1", new: `maxUnavailable: "1%"`},
	{name: "pdb percentage that rounds to no pod", file: "pdb.yaml", old: "maxUnavailable: 1", new: `maxUnavailable: "0%"`,
		wantInErrs: []string{"spec.maxUnavailable 0% of 3 replicas is 0 pods"}},
	{name: "pdb percentage over 100", file: "pdb.yaml", old: "maxUnavailable: 1", new: `maxUnavailable: "150%"`,
		wantInErrs: []string{`spec.maxUnavailable "150%": a percentage must not be above 100%`}},
	{name: "pdb count in a string", file: "pdb.yaml", old: "maxUnavailable: 1", new: `maxUnavailable: "1"`,
		wantInErrs: []string{`spec.maxUnavailable "1": want a count or a percentage`}},
	{name: "pod labels", file: "statefulset.yaml", old: "    metadata:\n      labels: {app: orders}", new: "    metadata:\n      labels: {app: orders-v2}",
		wantInErrs: []string{"StatefulSet orders: spec.selector", "Service orders: spec.selector", "PodDisruptionBudget orders: spec.selector"}},

	// Memory.
	{name: "GOMEMLIMIT under the formula", file: "statefulset.yaml", old: "value: 288MiB", new: "value: 256MiB",
		wantInErrs: []string{"env[GOMEMLIMIT] 256.0 MiB", "< 273.2 MiB = MaxBufferedBytes 256.0 MiB"}},
	{name: "GOMEMLIMIT too close to the limit", file: "statefulset.yaml", old: "value: 288MiB", new: "value: 400MiB",
		wantInErrs: []string{"limits.memory 576Mi < 2 × GOMEMLIMIT 400.0 MiB"}},
	{name: "memory limit not twice GOMEMLIMIT", file: "statefulset.yaml", old: "limits: {memory: 576Mi}", new: "limits: {memory: 512Mi}",
		wantInErrs: []string{"limits.memory 512Mi < 2 × GOMEMLIMIT 288.0 MiB", "requests.memory 576Mi > limits.memory 512Mi"}},
	{name: "GOMEMLIMIT with a unit Go does not read", file: "statefulset.yaml", old: "value: 288MiB", new: "value: 288Mi",
		wantInErrs: []string{`env[GOMEMLIMIT] "288Mi"`}},
	{name: "GOMEMLIMIT unset", file: "statefulset.yaml", old: "            - name: GOMEMLIMIT\n              value: 288MiB\n", new: "",
		wantInErrs: []string{"env[GOMEMLIMIT] is unset"}},
	{name: "GOMEMLIMIT from the limit itself", file: "statefulset.yaml", old: "              value: 288MiB\n", new: "              valueFrom: {resourceFieldRef: {resource: limits.memory}}\n",
		wantInErrs: []string{"limits.memory 576Mi < 2 × GOMEMLIMIT 576.0 MiB"}},
	{name: "GOMEMLIMIT from the limit in MiB", file: "statefulset.yaml", old: "              value: 288MiB\n", new: "              valueFrom: {resourceFieldRef: {resource: limits.memory, divisor: 1Mi}}\n",
		wantInErrs: []string{"env[GOMEMLIMIT] 576 B", "resourceFieldRef limits.memory"}},

	{name: "MaxBufferedBytes above what GOMEMLIMIT was sized for", file: "configmap.yaml", old: `  ORDERS_SESSION_TIMEOUT: "45s"`, new: `  ORDERS_SESSION_TIMEOUT: "45s"
  ORDERS_MAX_BUFFERED_BYTES: "512MiB"`,
		wantInErrs: []string{"env[GOMEMLIMIT] 288.0 MiB", "= MaxBufferedBytes 512.0 MiB"}},
	{name: "MaxBufferedBytes below the default", file: "configmap.yaml", old: `  ORDERS_SESSION_TIMEOUT: "45s"`, new: `  ORDERS_SESSION_TIMEOUT: "45s"
  ORDERS_MAX_BUFFERED_BYTES: "64MiB"`},
	{name: "MaxBufferedBytes in a unit the example does not read", file: "configmap.yaml", old: `  ORDERS_SESSION_TIMEOUT: "45s"`, new: `  ORDERS_SESSION_TIMEOUT: "45s"
  ORDERS_MAX_BUFFERED_BYTES: "64Mi"`,
		wantInErrs: []string{`ORDERS_MAX_BUFFERED_BYTES "64Mi"`}},
	{name: "MaxBufferedBytes from the args", file: "statefulset.yaml", old: "value: 288MiB", new: "value: 600MiB\n          args: [-max-buffered-bytes, 600MiB]",
		wantInErrs: []string{"= MaxBufferedBytes 600.0 MiB", "limits.memory 576Mi < 2 × GOMEMLIMIT 600.0 MiB"}},

	// Static membership.
	{name: "session too short for a replacement", file: "configmap.yaml", old: `ORDERS_SESSION_TIMEOUT: "45s"`, new: `ORDERS_SESSION_TIMEOUT: "10s"`,
		wantInErrs: []string{"ORDERS_SESSION_TIMEOUT 10s", "< 30s", "static membership"}},
	{name: "session unset: the example's 10s", file: "configmap.yaml", old: `  ORDERS_SESSION_TIMEOUT: "45s"`, new: ``,
		wantInErrs: []string{"ORDERS_SESSION_TIMEOUT 10s (unset"}},
	{name: "one instance id for every pod", file: "statefulset.yaml", old: "              valueFrom: {fieldRef: {fieldPath: metadata.name}}\n", new: "              value: orders\n",
		wantInErrs: []string{"env[ORDERS_INSTANCE_ID]", "want valueFrom.fieldRef metadata.name"}},
	{name: "configmap missing", file: "configmap.yaml", old: "  name: orders\n", new: "  name: orders-config\n",
		wantInErrs: []string{`envFrom configMapRef "orders": no ConfigMap`}},
}

func TestOrdersKitMutations(t *testing.T) {
	base := readKit(t)
	for _, m := range kitMutations {
		t.Run(m.name, func(t *testing.T) {
			files := map[string][]byte{}
			for n, b := range base {
				files[n] = b
			}
			if m.file2 != "" {
				files[m.file2] = edit(t, files[m.file2], m.old2, m.new2)
			}
			files[m.file] = edit(t, files[m.file], m.old, m.new)
			k, err := manifests.Decode(files)
			if err == nil && !m.decodeErr {
				err = k.Check(manifests.OrdersSizing)
			} else if err == nil {
				t.Fatalf("decoded; want a decoding error naming %q", m.wantInErrs)
			} else if !m.decodeErr {
				t.Fatalf("decoding failed, want it to decode and the checks to find %q: %v", m.wantInErrs, err)
			}
			if len(m.wantInErrs) == 0 {
				if err != nil {
					t.Fatalf("want no error, got: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("no error; want one naming %q", m.wantInErrs)
			}
			for _, w := range m.wantInErrs {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not name %q:\n%v", w, err)
				}
			}
		})
	}
}

// edit replaces old by new in b, and fails unless old occurs exactly once:
// a mutation that matched nothing would test the unmutated kit.
func edit(t *testing.T, b []byte, old, new string) []byte {
	t.Helper()
	if n := strings.Count(string(b), old); n != 1 {
		t.Fatalf("the mutation's text %q occurs %d times, want once", old, n)
	}
	return []byte(strings.Replace(string(b), old, new, 1))
}

// TestOrdersFlagsAreMains: the check's table of the example's flags is
// the one examples/orders/main.go registers in parseConfig, each flag
// with the variable its default comes from (dsn's default is "", the
// variable read after parsing, so that usage does not print the password).
func TestOrdersFlagsAreMains(t *testing.T) {
	const main = "../../examples/orders/main.go"
	f, err := parser.ParseFile(token.NewFileSet(), main, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	ast.Inspect(f, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok || fmt.Sprint(sel.X) != "fs" {
			return true
		}
		args := call.Args
		switch sel.Sel.Name {
		case "StringVar", "IntVar", "DurationVar", "BoolVar":
			args = args[1:]
		case "String", "Int", "Duration", "Bool":
		default:
			return true
		}
		name, err := strconv.Unquote(args[0].(*ast.BasicLit).Value)
		if err != nil {
			t.Fatal(err)
		}
		got[name] = ""
		if d, ok := args[1].(*ast.CallExpr); ok && fmt.Sprint(d.Fun) == "env" {
			got[name], _ = strconv.Unquote(d.Args[0].(*ast.BasicLit).Value)
		}
		if sel.Sel.Name == "Bool" || sel.Sel.Name == "BoolVar" {
			t.Errorf("%s: -%s is a boolean flag, which manifests.OrdersFlags parses as one taking a value", main, name)
		}
		return true
	})
	if len(got) == 0 {
		t.Fatalf("%s: no fs.String/fs.StringVar flags found", main)
	}
	got["dsn"] = "TIDEMARK_PG_DSN" // read after parsing: c.dsn = env("TIDEMARK_PG_DSN", "")
	for name, env := range got {
		if manifests.OrdersFlags[name] != env {
			t.Errorf("%s: -%s [%s]; manifests.OrdersFlags has [%s]", main, name, env, manifests.OrdersFlags[name])
		}
	}
	for name := range manifests.OrdersFlags {
		if _, ok := got[name]; !ok {
			t.Errorf("manifests.OrdersFlags has -%s, which %s does not register", name, main)
		}
	}
}
