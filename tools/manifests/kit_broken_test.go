package manifests_test

import (
	"testing"

	"github.com/tidemark/tidemark/tools/manifests"
)

// reviewMutations are edits of the kit that a cluster would refuse, or
// that would leave a pod that never becomes ready or crash-loops, and
// that the check must therefore refuse. Each names why in a comment.
var reviewMutations = []mutation{
	// The process listens on the loopback interface only: the kubelet
	// probes the pod's IP, so every probe is refused; the pod never gets
	// ready and liveness restarts it (after the startup probe's 60s).
	{name: "service listens on loopback only", file: "configmap.yaml", old: `ORDERS_HTTP: ":8080"`, new: `ORDERS_HTTP: "127.0.0.1:8080"`,
		wantInErrs: []string{"ORDERS_HTTP"}},
	// A flag wins over its variable (examples/orders parseConfig: the
	// variable is only the flag's default): the process listens on 9090,
	// the probes and the scrape go to 8080.
	{name: "args override ORDERS_HTTP", file: "statefulset.yaml", old: "          image: tidemark-orders:latest\n", new: "          image: tidemark-orders:latest\n          args: [\"-http\", \":9090\"]\n",
		wantInErrs: []string{"9090"}},
	// A flag wins over ORDERS_SESSION_TIMEOUT: static membership with a
	// 10s session, which the check refuses when it comes from the env.
	{name: "args override the session timeout", file: "statefulset.yaml", old: "          image: tidemark-orders:latest\n", new: "          image: tidemark-orders:latest\n          args: [\"-session-timeout\", \"10s\"]\n",
		wantInErrs: []string{"10s"}},
	// The service serves plain HTTP: an HTTPS probe fails its handshake.
	{name: "readiness probe over HTTPS", file: "statefulset.yaml", old: "httpGet: {path: /readyz, port: http}", new: "httpGet: {path: /readyz, port: http, scheme: HTTPS}",
		wantInErrs: []string{"readinessProbe"}},
	// The kubelet would probe the node's own loopback, not the pod.
	{name: "liveness probe host set", file: "statefulset.yaml", old: "            # because a handler or the database is slow.\n            httpGet: {path: /livez, port: http}", new: "            # because a handler or the database is slow.\n            httpGet: {path: /livez, port: http, host: 127.0.0.1}",
		wantInErrs: []string{"livenessProbe"}},
	// The API server refuses both: "minAvailable and maxUnavailable
	// cannot be both set" (policy validation).
	{name: "pdb minAvailable and maxUnavailable", file: "pdb.yaml", old: "  maxUnavailable: 1\n", new: "  maxUnavailable: 1\n  minAvailable: 2\n",
		wantInErrs: []string{"minAvailable"}},
	// A port name is an IANA_SVC_NAME: at most 15 characters. The API
	// server refuses the StatefulSet (spec.template.spec.containers[0].
	// ports[0].name: must be no more than 15 characters).
	{name: "port name longer than 15", file: "statefulset.yaml", old: "{name: http, containerPort: 8080}", new: "{name: http, containerPort: 8080}\n            - {name: prometheus-metrics, containerPort: 9100}",
		wantInErrs: []string{"prometheus-metrics"}},
	// Nor upper case or an underscore (IANA_SVC_NAME: [a-z0-9-]).
	{name: "port name not an IANA_SVC_NAME", file: "statefulset.yaml", old: "{name: http, containerPort: 8080}", new: "{name: http, containerPort: 8080}\n            - {name: Debug_Port, containerPort: 6060}",
		wantInErrs: []string{"Debug_Port"}},
	// The Service's targetPort names no port of the container: the
	// endpoints controller finds no port for the pod.
	{name: "service targetPort names no container port", file: "service.yaml", old: "targetPort: http", new: "targetPort: metrics",
		wantInErrs: []string{"targetPort"}},
	// examples/orders exits 2 at once without a database ("no database:
	// set -dsn or TIDEMARK_PG_DSN"): a crash loop.
	{name: "database variable removed", file: "statefulset.yaml", old: "            - name: TIDEMARK_PG_DSN\n              valueFrom: {secretKeyRef: {name: orders-db, key: dsn}}\n", new: "",
		wantInErrs: []string{"TIDEMARK_PG_DSN"}},
	// Likewise without brokers ("no brokers: set -brokers or
	// TIDEMARK_KAFKA_BROKERS").
	{name: "brokers variable removed", file: "configmap.yaml", old: "  TIDEMARK_KAFKA_BROKERS: \"kafka:9092\"\n", new: "",
		wantInErrs: []string{"TIDEMARK_KAFKA_BROKERS"}},
}

// TestKitMutations: the check refuses each of reviewMutations, edits
// that would fail on a cluster (it once accepted them).
func TestKitMutations(t *testing.T) {
	base := readKit(t)
	for _, m := range reviewMutations {
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
			if err == nil {
				err = k.Check(manifests.OrdersSizing)
			}
			if err == nil {
				t.Fatalf("the check accepts the kit with %q; want an error naming %q", m.name, m.wantInErrs)
			}
			t.Logf("refused: %v", err)
		})
	}
}

// TestKitMutationsThatHold: mutations the check refuses today, kept
// so that it goes on refusing them.
func TestKitMutationsThatHold(t *testing.T) {
	base := readKit(t)
	for _, m := range []mutation{
		{name: "grace period as a string", file: "statefulset.yaml", old: "terminationGracePeriodSeconds: 25", new: `terminationGracePeriodSeconds: "25"`},
		{name: "replicas as a string", file: "statefulset.yaml", old: "replicas: 3 ", new: `replicas: "3" `},
		{name: "probe port a number in a string", file: "statefulset.yaml", old: "httpGet: {path: /readyz, port: http}", new: `httpGet: {path: /readyz, port: "8080"}`},
		{name: "budget with a space", file: "configmap.yaml", old: `TIDEMARK_SHUTDOWN_BUDGET: "20s"`, new: `TIDEMARK_SHUTDOWN_BUDGET: " 20s"`},
		{name: "budget negative", file: "configmap.yaml", old: `TIDEMARK_SHUTDOWN_BUDGET: "20s"`, new: `TIDEMARK_SHUTDOWN_BUDGET: "-20s"`},
		{name: "pdb percent", file: "pdb.yaml", old: "maxUnavailable: 1", new: `maxUnavailable: "0%"`},
		{name: "selector superset of the pod labels", file: "statefulset.yaml", old: "  selector:\n    matchLabels: {app: orders}", new: "  selector:\n    matchLabels: {app: orders, v: \"2\"}"},
		{name: "instance id from the uid", file: "statefulset.yaml", old: "fieldPath: metadata.name", new: "fieldPath: metadata.uid"},
		{name: "GOMEMLIMIT with a space", file: "statefulset.yaml", old: "value: 288MiB", new: `value: "288 MiB"`},
	} {
		t.Run(m.name, func(t *testing.T) {
			files := map[string][]byte{}
			for n, b := range base {
				files[n] = b
			}
			files[m.file] = edit(t, files[m.file], m.old, m.new)
			k, err := manifests.Decode(files)
			if err == nil {
				err = k.Check(manifests.OrdersSizing)
			}
			if err == nil {
				t.Fatalf("the check accepts the kit with %q", m.name)
			}
			t.Logf("refused: %v", err)
		})
	}
}
