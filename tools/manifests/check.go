package manifests

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/shutdown"
)

// Sizing is what the memory check derives GOMEMLIMIT from, with the
// formula of docs/runner.md ("The whole process"): GOMEMLIMIT a little
// above MaxBufferedBytes plus the partition constants, the memory limit
// about twice it.
type Sizing struct {
	// MaxBufferedBytes is B, the runner's cap on what the process holds
	// for records.
	MaxBufferedBytes int64
	// HeapOverB is what the live heap may hold beyond B whatever the
	// records (TestBoundedMemory's bound: 1 MiB).
	HeapOverB int64
	// Partitions is how many partitions one pod may own, and have owned.
	Partitions int64
	// Service is the allowance for the service's own memory outside
	// tidemark (database pool, handler goroutines, telemetry, HTTP).
	Service int64
}

// OrdersSizing is the orders example's: the runner's default
// MaxBufferedBytes (a kit that sets ORDERS_MAX_BUFFERED_BYTES or
// -max-buffered-bytes is checked against its own), 64 partitions (the topic has
// 12 by default), 16 MiB for pgx, 64 handlers, OpenTelemetry and HTTP.
var OrdersSizing = Sizing{
	MaxBufferedBytes: 256 << 20,
	HeapOverB:        1 << 20,
	Partitions:       64,
	Service:          16 << 20,
}

// MinGOMEMLIMIT is the least GOMEMLIMIT the formula allows.
func (s Sizing) MinGOMEMLIMIT() int64 {
	return s.MaxBufferedBytes + s.HeapOverB + s.Partitions*(runner.PartitionOverhead+runner.PartitionGoneOverhead) + s.Service
}

// Names of the orders example's settings (examples/orders/main.go) and
// their defaults there.
const (
	envBudget   = "TIDEMARK_SHUTDOWN_BUDGET"
	envBrokers  = "TIDEMARK_KAFKA_BROKERS"
	envDSN      = "TIDEMARK_PG_DSN"
	envHTTP     = "ORDERS_HTTP"
	defHTTP     = ":8080"
	envInstance = "ORDERS_INSTANCE_ID"
	envSession  = "ORDERS_SESSION_TIMEOUT"
	defSession  = 10 * time.Second
	envMemLimit = "GOMEMLIMIT"
	// envMaxBuffered is runner.MaxBufferedBytes, in GOMEMLIMIT's format;
	// unset, the runner's default (Sizing.MaxBufferedBytes).
	envMaxBuffered = "ORDERS_MAX_BUFFERED_BYTES"
)

// MinStaticSession is the least session timeout the check accepts when
// static membership is on: a pod replacement (the old pod gone, the new
// one scheduled and started, the process connected to PostgreSQL and
// joined) within it keeps the pod's partitions without a rebalance. It is
// an estimate for a node that has the image, not a measurement: no cluster
// is reachable here.
const MinStaticSession = 30 * time.Second

// StopMargin is the least time the check asks the grace period (or
// Compose's stop_grace_period) to leave after preStop and the shutdown
// budget (docs/operations.md, Shutdown: "with a margin on top"): the
// budget ends when the coordinator's Stop returns, and the process then
// waits for the runner's Run to return and exits, at once after a clean
// stop, but after a runner that ran out of time as long as its handlers
// take to honour their cancelled ctx and the client to close. An
// allowance, not a measurement.
const StopMargin = 2 * time.Second

// defaultGrace is Kubernetes' terminationGracePeriodSeconds when unset.
const defaultGrace = 30

// Check checks that the kit's numbers agree; each error names the file,
// the object and the field.
func (k *Kit) Check(sz Sizing) error {
	var errs []error
	fail := func(obj any, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", k.where(obj), fmt.Sprintf(format, args...)))
	}
	if len(k.StatefulSets) != 1 {
		return fmt.Errorf("want exactly one StatefulSet, have %d", len(k.StatefulSets))
	}
	sts := k.StatefulSets[0]
	pod := sts.Spec.Template
	podLabels := labels.Set(pod.Labels)

	if sel, err := metav1.LabelSelectorAsSelector(sts.Spec.Selector); err != nil || sts.Spec.Selector == nil || sel.Empty() || !sel.Matches(podLabels) {
		fail(sts, "spec.selector %s does not select spec.template.metadata.labels %s", metav1.FormatLabelSelector(sts.Spec.Selector), podLabels)
	}

	// The headless Service behind serviceName, selecting the pods.
	var svc *corev1.Service
	for _, s := range k.Services {
		if s.Name == sts.Spec.ServiceName {
			svc = s
		}
	}
	switch {
	case sts.Spec.ServiceName == "":
		fail(sts, "spec.serviceName is empty: a StatefulSet needs the headless Service that governs its pods' names")
	case svc == nil:
		fail(sts, "spec.serviceName %q: no Service of that name in the kit", sts.Spec.ServiceName)
	default:
		if svc.Spec.ClusterIP != corev1.ClusterIPNone {
			fail(svc, "spec.clusterIP %q: the Service a StatefulSet's serviceName names must be headless (clusterIP: None)", svc.Spec.ClusterIP)
		}
	}
	for _, s := range k.Services {
		if len(s.Spec.Selector) == 0 || !labels.SelectorFromSet(s.Spec.Selector).Matches(podLabels) {
			fail(s, "spec.selector %s does not select the pods (spec.template.metadata.labels %s of StatefulSet %s)", labels.Set(s.Spec.Selector), podLabels, sts.Name)
		}
	}

	// The disruption budget: selects the pods and lets one go.
	if len(k.PDBs) == 0 {
		fail(sts, "no PodDisruptionBudget selects its pods")
	}
	for _, p := range k.PDBs {
		sel, err := metav1.LabelSelectorAsSelector(p.Spec.Selector)
		if err != nil || p.Spec.Selector == nil || sel.Empty() || !sel.Matches(podLabels) {
			fail(p, "spec.selector %s does not select the pods (spec.template.metadata.labels %s of StatefulSet %s)", metav1.FormatLabelSelector(p.Spec.Selector), podLabels, sts.Name)
		}
		if p.Spec.MinAvailable != nil && p.Spec.MaxUnavailable != nil {
			fail(p, "spec.minAvailable and spec.maxUnavailable are both set: the API server refuses that (set only maxUnavailable)")
		}
		// A percentage is of the StatefulSet's replicas, rounded up, as
		// the disruption controller computes it; the API server refuses
		// one above 100%.
		replicas := 1
		if sts.Spec.Replicas != nil {
			replicas = int(*sts.Spec.Replicas)
		}
		switch mu := p.Spec.MaxUnavailable; {
		case mu == nil:
			fail(p, "spec.maxUnavailable is unset: want 1 (one pod evicted at a time)")
		case mu.Type == intstr.String:
			n, err := intstr.GetScaledValueFromIntOrPercent(mu, replicas, true)
			pct, _ := strconv.Atoi(strings.TrimSuffix(mu.StrVal, "%"))
			switch {
			case err != nil || !strings.HasSuffix(mu.StrVal, "%"):
				fail(p, "spec.maxUnavailable %q: want a count or a percentage such as 50%%", mu.StrVal)
			case pct > 100:
				fail(p, "spec.maxUnavailable %q: a percentage must not be above 100%%", mu.StrVal)
			case n < 1:
				fail(p, "spec.maxUnavailable %s of %d replicas is %d pods: want at least 1, or no drain can evict a pod", mu.StrVal, replicas, n)
			}
		case mu.IntVal < 1:
			fail(p, "spec.maxUnavailable %s: want a count of at least 1, or no drain can evict a pod", mu.String())
		}
	}

	if len(pod.Spec.Containers) != 1 {
		fail(sts, "spec.template.spec.containers: want one container (the orders service), have %d", len(pod.Spec.Containers))
		return errors.Join(errs...)
	}
	c := &pod.Spec.Containers[0]
	cpath := "spec.template.spec.containers[" + c.Name + "]"
	// What the process sees: a flag in args wins over its variable, an
	// empty variable is the example's default (examples/orders
	// parseConfig, shutdown.BudgetFromEnv).
	flags, err := k.ordersArgs(sts, c, cpath)
	if err != nil {
		errs = append(errs, err)
	}
	setting := func(name string) (envValue, error) { return k.setting(sts, c, flags, name) }

	// Without brokers or a database the example exits 2 at once: a crash
	// loop.
	for _, name := range []string{envBrokers, envDSN} {
		if v, err := setting(name); err != nil {
			errs = append(errs, err)
		} else if !v.set || (v.known() && strings.Trim(v.value, ", ") == "") {
			fail(sts, "%s %s is empty or unset (%s): examples/orders exits 2 without it (a crash loop)", cpath, name, v.src)
		}
	}

	// The grace period covers preStop and the whole shutdown budget.
	budget := shutdown.DefaultBudget
	v, err := setting(envBudget)
	bsrc := v.src
	if err != nil {
		errs = append(errs, err)
	} else if v.set {
		d, err := time.ParseDuration(v.value)
		if err != nil || d <= 0 {
			fail(sts, "%s %s=%q (%s): not a positive duration", cpath, envBudget, v.value, v.src)
		}
		budget = d
	}
	var preStop time.Duration
	if lc := c.Lifecycle; lc != nil && lc.PreStop != nil {
		switch h := lc.PreStop; {
		case h.Sleep != nil:
			preStop = time.Duration(h.Sleep.Seconds) * time.Second
		default:
			fail(sts, "%s.lifecycle.preStop: only a sleep action has a duration this check can read", cpath)
		}
	}
	grace := int64(defaultGrace)
	if g := pod.Spec.TerminationGracePeriodSeconds; g != nil {
		grace = *g
	}
	if time.Duration(grace)*time.Second < preStop+budget+StopMargin {
		fail(sts, "spec.template.spec.terminationGracePeriodSeconds %d < %s.lifecycle.preStop %s + %s %s (%s) + %s margin: the kubelet would kill the process before its stop ends",
			grace, cpath, preStop, envBudget, budget, bsrc, StopMargin)
	}

	// One HTTP port serves the probes and /metrics: the one the process
	// listens on (ORDERS_HTTP), which must be a container port, on every
	// interface (the kubelet probes the pod's IP, which the manifest
	// cannot name).
	httpPort := intstr.FromString("")
	hsrc := envHTTP
	if v, err := setting(envHTTP); err != nil {
		errs = append(errs, err)
	} else {
		addr := defHTTP
		if v.set {
			addr, hsrc = v.value, v.src
		}
		h, p, err := net.SplitHostPort(addr)
		n, perr := strconv.Atoi(p)
		switch {
		case !v.known() && v.set:
			fail(sts, "%s %s (%s): the check cannot read the address", cpath, envHTTP, v.src)
		case err != nil || perr != nil:
			fail(sts, "%s %s=%q (%s): not host:port with a port number", cpath, envHTTP, addr, hsrc)
		default:
			httpPort = intstr.FromInt32(int32(n))
			if ip := net.ParseIP(h); h != "" && (ip == nil || !ip.IsUnspecified()) {
				fail(sts, "%s %s=%q (%s): the kubelet probes the pod's IP, and a scrape comes from outside; listen on every interface (:%s)", cpath, envHTTP, addr, hsrc, p)
			}
		}
	}
	// Port names: the API server refuses a container port name that is
	// not an IANA_SVC_NAME (at most 15 of [a-z0-9-], a letter among them)
	// and a Service port name that is not a DNS label. A Service's
	// targetPort must be a port of the container, by name or number (a
	// missing one is the port itself), or the Service has no endpoint
	// port for the pod.
	for i, cp := range c.Ports {
		if cp.Name == "" {
			continue
		}
		if msgs := validation.IsValidPortName(cp.Name); len(msgs) > 0 {
			fail(sts, "%s.ports[%d].name %q: not an IANA_SVC_NAME: %s", cpath, i, cp.Name, strings.Join(msgs, "; "))
		}
	}
	for _, s := range k.Services {
		for i, sp := range s.Spec.Ports {
			if sp.Name != "" {
				if msgs := validation.IsDNS1123Label(sp.Name); len(msgs) > 0 {
					fail(s, "spec.ports[%d].name %q: not a DNS label: %s", i, sp.Name, strings.Join(msgs, "; "))
				}
			}
			tp := sp.TargetPort
			if tp.Type == intstr.Int && tp.IntVal == 0 {
				tp = intstr.FromInt32(sp.Port)
			}
			if _, ok := containerPort(c, tp); !ok {
				fail(s, "spec.ports[%d].targetPort %s: not a port of container %s of StatefulSet %s (%s)", i, tp.String(), c.Name, sts.Name, portList(c))
			}
		}
	}

	listenPort, ok := containerPort(c, httpPort)
	if httpPort.IntVal != 0 && !ok {
		fail(sts, "%s.ports: the service listens on %s (%s) and no container port is %d", cpath, httpPort.String(), hsrc, httpPort.IntVal)
	}
	// The startup probe, optional, holds the liveness probe off until the
	// process serves: /livez answers 200 from then until the poll loop
	// stops.
	probes := []struct {
		field, path string
		required    bool
		p           *corev1.Probe
	}{
		{"readinessProbe", "/readyz", true, c.ReadinessProbe},
		{"livenessProbe", "/livez", true, c.LivenessProbe},
		{"startupProbe", "/livez", false, c.StartupProbe},
	}
	for _, pr := range probes {
		if pr.p == nil {
			if pr.required {
				fail(sts, "%s.%s is missing: want httpGet %s", cpath, pr.field, pr.path)
			}
			continue
		}
		g := pr.p.HTTPGet
		if g == nil {
			fail(sts, "%s.%s: want an httpGet probe of %s", cpath, pr.field, pr.path)
			continue
		}
		if g.Path != pr.path {
			fail(sts, "%s.%s.httpGet.path %q: want %s", cpath, pr.field, g.Path, pr.path)
		}
		// The service serves plain HTTP; the kubelet probes the pod's IP
		// unless host names another address (the node's own loopback, for
		// 127.0.0.1).
		if g.Scheme != "" && g.Scheme != corev1.URISchemeHTTP {
			fail(sts, "%s.%s.httpGet.scheme %s: the service serves plain HTTP, want HTTP (or unset)", cpath, pr.field, g.Scheme)
		}
		if g.Host != "" {
			fail(sts, "%s.%s.httpGet.host %q: the kubelet would probe that address, not the pod; leave it unset (the pod's IP)", cpath, pr.field, g.Host)
		}
		p, ok := containerPort(c, g.Port)
		switch {
		case !ok:
			fail(sts, "%s.%s.httpGet.port %s is not a port of the container (%s)", cpath, pr.field, g.Port.String(), portList(c))
		case ok && listenPort != 0 && p != listenPort:
			fail(sts, "%s.%s.httpGet.port %s is container port %d; the probes are served on %d (%s)", cpath, pr.field, g.Port.String(), p, listenPort, hsrc)
		}
	}

	// Prometheus's scrape annotations name the metrics port and path.
	ann := pod.Annotations
	if ann["prometheus.io/scrape"] != "true" {
		fail(sts, "spec.template.metadata.annotations[prometheus.io/scrape] %q: want \"true\"", ann["prometheus.io/scrape"])
	}
	if p := ann["prometheus.io/path"]; p != "" && p != "/metrics" {
		fail(sts, "spec.template.metadata.annotations[prometheus.io/path] %q: the service serves /metrics", p)
	}
	if n, err := strconv.Atoi(ann["prometheus.io/port"]); err != nil {
		fail(sts, "spec.template.metadata.annotations[prometheus.io/port] %q: want the metrics port", ann["prometheus.io/port"])
	} else if p, ok := containerPort(c, intstr.FromInt32(int32(n))); !ok || listenPort == 0 || p != listenPort {
		fail(sts, "spec.template.metadata.annotations[prometheus.io/port] %d: not the container port /metrics is served on (%s %s; %s)", n, envHTTP, httpPort.String(), portList(c))
	}

	// Memory: GOMEMLIMIT from MaxBufferedBytes (the kit's, or the
	// runner's default), the limit twice it.
	if v, err := setting(envMaxBuffered); err != nil {
		errs = append(errs, err)
	} else if v.set && !v.known() {
		fail(sts, "%s %s (%s): the check cannot read it, and sizes GOMEMLIMIT from it; set it in the manifest", cpath, envMaxBuffered, v.src)
	} else if v.set {
		if b, err := parseGOMEMLIMIT(v.value); err != nil {
			fail(sts, "%s %s %q (%s): %v", cpath, envMaxBuffered, v.value, v.src, err)
		} else {
			sz.MaxBufferedBytes = b
		}
	}
	limit, hasLimit := c.Resources.Limits[corev1.ResourceMemory]
	if !hasLimit {
		fail(sts, "%s.resources.limits.memory is unset", cpath)
	}
	if v, err := k.env(sts, c, envMemLimit); err != nil {
		errs = append(errs, err)
	} else if !v.set {
		fail(sts, "%s.env[%s] is unset: the Go runtime would not know the memory limit", cpath, envMemLimit)
	} else if gml, err := parseGOMEMLIMIT(v.value); err != nil {
		fail(sts, "%s.env[%s] %q (%s): %v", cpath, envMemLimit, v.value, v.src, err)
	} else {
		if min := sz.MinGOMEMLIMIT(); gml < min {
			fail(sts, "%s.env[%s] %s (%s) < %s = MaxBufferedBytes %s + %s heap + %d partitions × %d B + %s for the service (docs/runner.md): as the records reach the cap the collector would run without pause",
				cpath, envMemLimit, mib(gml), v.src, mib(min), mib(sz.MaxBufferedBytes), mib(sz.HeapOverB), sz.Partitions, runner.PartitionOverhead+runner.PartitionGoneOverhead, mib(sz.Service))
		}
		if hasLimit && limit.Value() < 2*gml {
			fail(sts, "%s.resources.limits.memory %s < 2 × %s %s (docs/runner.md: the resident set reaches about twice the live heap)",
				cpath, limit.String(), envMemLimit, mib(gml))
		}
	}
	if req, ok := c.Resources.Requests[corev1.ResourceMemory]; ok && hasLimit && req.Cmp(limit) > 0 {
		fail(sts, "%s.resources.requests.memory %s > limits.memory %s", cpath, req.String(), limit.String())
	}

	// Static membership by pod name, with a session timeout that covers a
	// pod's replacement.
	if v, err := setting(envInstance); err != nil {
		errs = append(errs, err)
	} else if v.set {
		if v.fieldRef != "metadata.name" {
			fail(sts, "%s.env[%s] (%s): want valueFrom.fieldRef metadata.name, one id per pod; a shared id makes the broker fence all but one pod", cpath, envInstance, v.src)
		}
		session := defSession
		sv, err := setting(envSession)
		ssrc := sv.src
		if err != nil {
			errs = append(errs, err)
		} else if sv.set {
			if session, err = time.ParseDuration(sv.value); err != nil {
				fail(sts, "%s %s=%q (%s): not a duration", cpath, envSession, sv.value, sv.src)
			}
		}
		if session < MinStaticSession {
			fail(sts, "%s %s %s (%s) < %s: with static membership (%s) a replaced pod would lose its partitions to a rebalance before it is back",
				cpath, envSession, session, ssrc, MinStaticSession, envInstance)
		}
	}
	return joinUnique(errs)
}

// joinUnique joins errs, each message once (a missing ConfigMap fails
// every variable looked up in it).
func joinUnique(errs []error) error {
	seen := map[string]bool{}
	var out []error
	for _, e := range errs {
		if !seen[e.Error()] {
			seen[e.Error()] = true
			out = append(out, e)
		}
	}
	return errors.Join(out...)
}

// containerPort resolves a probe's port, by name or number, to one of the
// container's ports.
func containerPort(c *corev1.Container, p intstr.IntOrString) (int32, bool) {
	for _, cp := range c.Ports {
		if (p.Type == intstr.String && p.StrVal != "" && cp.Name == p.StrVal) || (p.Type == intstr.Int && cp.ContainerPort == p.IntVal) {
			return cp.ContainerPort, true
		}
	}
	return 0, false
}

func portList(c *corev1.Container) string {
	var s []string
	for _, cp := range c.Ports {
		s = append(s, fmt.Sprintf("%s=%d", cp.Name, cp.ContainerPort))
	}
	return "ports " + strings.Join(s, ", ")
}

// envValue is a container's environment variable as the pod would see it.
type envValue struct {
	set      bool
	value    string // known value
	fieldRef string // from valueFrom.fieldRef: its path (value unknown)
	secret   bool   // from a Secret (value unknown)
	src      string // where it is set, for messages
}

// known reports whether the value is in the kit (not a Secret's or the
// pod's field).
func (v envValue) known() bool { return v.set && v.fieldRef == "" && !v.secret }

// OrdersFlags are examples/orders' flags (parseConfig), each with the
// variable that gives its default. TestOrdersFlagsAreMains checks them
// against examples/orders/main.go.
var OrdersFlags = map[string]string{
	"brokers":            envBrokers,
	"dsn":                envDSN,
	"group":              "ORDERS_GROUP",
	"topic":              "ORDERS_TOPIC",
	"dlq":                "ORDERS_DLQ",
	"http":               envHTTP,
	"concurrency":        "ORDERS_CONCURRENCY",
	"instance-id":        envInstance,
	"delay":              "ORDERS_DELAY",
	"session-timeout":    envSession,
	"mode":               "ORDERS_MODE",
	"share-lock":         "ORDERS_SHARE_LOCK",
	"controls":           "ORDERS_CONTROLS",
	"effect":             "ORDERS_EFFECT",
	"kafka-dial":         "ORDERS_KAFKA_DIAL",
	"metadata-max-age":   "ORDERS_METADATA_MAX_AGE",
	"max-buffered-bytes": envMaxBuffered,
}

// ordersArgs parses the container's args as examples/orders does (the
// flag package: flags before the first other argument), variable → the
// flag's value. It refuses what it cannot read the way the process would:
// a command (another entrypoint than the image's), a $(VAR) reference
// (the kubelet expands it), an argument that is not a flag (the example
// ignores it and every argument after it) and a flag the example does not
// have (it exits 2).
func (k *Kit) ordersArgs(sts *appsv1.StatefulSet, c *corev1.Container, cpath string) (map[string]string, error) {
	where := k.where(sts) + ": " + cpath
	if len(c.Command) > 0 {
		return nil, fmt.Errorf("%s.command %q: the check reads the arguments of the image's entrypoint (examples/orders) only; leave command unset", where, c.Command)
	}
	for _, a := range c.Args {
		if strings.Contains(a, "$(") {
			return nil, fmt.Errorf("%s.args %q: the kubelet expands $(VAR) in %q, which the check cannot follow; set the variable instead", where, c.Args, a)
		}
	}
	fs := flag.NewFlagSet("orders", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	vals := map[string]*string{}
	for name := range OrdersFlags {
		vals[name] = fs.String(name, "", "")
	}
	if err := fs.Parse(c.Args); err != nil {
		return nil, fmt.Errorf("%s.args %q: %v: examples/orders would exit 2", where, c.Args, err)
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("%s.args %q: %q is not a flag: examples/orders ignores it and every argument after it", where, c.Args, fs.Arg(0))
	}
	out := map[string]string{}
	fs.Visit(func(f *flag.Flag) { out[OrdersFlags[f.Name]] = *vals[f.Name] })
	return out, nil
}

// setting is the example's setting whose variable is name as the process
// sees it: the flag when args give it (but an empty -dsn, which falls back
// to the variable), else the variable when set and not empty, else unset
// (the example's default).
func (k *Kit) setting(sts *appsv1.StatefulSet, c *corev1.Container, flags map[string]string, name string) (envValue, error) {
	if fv, ok := flags[name]; ok && (name != envDSN || fv != "") {
		for f, e := range OrdersFlags {
			if e == name {
				return envValue{set: true, value: fv, src: fmt.Sprintf("%s args -%s", k.where(sts), f)}, nil
			}
		}
	}
	v, err := k.env(sts, c, name)
	switch {
	case err != nil:
		return v, err
	case !v.set:
		v.src = "unset: the default"
	case v.known() && v.value == "":
		v = envValue{src: v.src + " empty: the default"}
	}
	return v, nil
}

// env resolves a variable of container c as the kubelet would: env
// overrides envFrom, a later envFrom source overrides an earlier one, a
// later env entry an earlier one.
func (k *Kit) env(sts *appsv1.StatefulSet, c *corev1.Container, name string) (envValue, error) {
	var v envValue
	for _, ef := range c.EnvFrom {
		if ef.ConfigMapRef == nil || !strings.HasPrefix(name, ef.Prefix) {
			continue
		}
		cm := k.configMap(ef.ConfigMapRef.Name)
		if cm == nil {
			if ef.ConfigMapRef.Optional != nil && *ef.ConfigMapRef.Optional {
				continue
			}
			return v, fmt.Errorf("%s: envFrom configMapRef %q: no ConfigMap of that name in the kit", k.where(sts), ef.ConfigMapRef.Name)
		}
		if val, ok := cm.Data[strings.TrimPrefix(name, ef.Prefix)]; ok {
			v = envValue{set: true, value: val, src: k.where(cm) + " data." + strings.TrimPrefix(name, ef.Prefix)}
		}
	}
	for _, e := range c.Env {
		if e.Name != name {
			continue
		}
		src := fmt.Sprintf("%s env[%s]", k.where(sts), name)
		switch vf := e.ValueFrom; {
		case vf == nil:
			v = envValue{set: true, value: e.Value, src: src}
		case vf.FieldRef != nil:
			v = envValue{set: true, fieldRef: vf.FieldRef.FieldPath, src: src + " fieldRef " + vf.FieldRef.FieldPath}
		case vf.ConfigMapKeyRef != nil:
			cm := k.configMap(vf.ConfigMapKeyRef.Name)
			val, ok := "", false
			if cm != nil {
				val, ok = cm.Data[vf.ConfigMapKeyRef.Key]
			}
			if !ok {
				return v, fmt.Errorf("%s: configMapKeyRef %s/%s: no such key in the kit", src, vf.ConfigMapKeyRef.Name, vf.ConfigMapKeyRef.Key)
			}
			v = envValue{set: true, value: val, src: src + " from " + k.where(cm)}
		case vf.ResourceFieldRef != nil:
			val, err := resourceFieldValue(c, vf.ResourceFieldRef)
			if err != nil {
				return v, fmt.Errorf("%s: resourceFieldRef: %w", src, err)
			}
			v = envValue{set: true, value: val, src: src + " resourceFieldRef " + vf.ResourceFieldRef.Resource}
		default:
			// A secret: set, value unknown here.
			v = envValue{set: true, secret: true, src: src + " (secret)"}
		}
	}
	return v, nil
}

func (k *Kit) configMap(name string) *corev1.ConfigMap {
	for _, cm := range k.ConfigMaps {
		if cm.Name == name {
			return cm
		}
	}
	return nil
}

// resourceFieldValue is what the kubelet puts in a variable from a
// resourceFieldRef: the quantity divided by the divisor (default 1),
// rounded up, as a bare integer.
func resourceFieldValue(c *corev1.Container, r *corev1.ResourceFieldSelector) (string, error) {
	var q resource.Quantity
	var ok bool
	switch r.Resource {
	case "limits.memory":
		q, ok = c.Resources.Limits[corev1.ResourceMemory]
	case "requests.memory":
		q, ok = c.Resources.Requests[corev1.ResourceMemory]
	default:
		return "", fmt.Errorf("resource %q: only limits.memory and requests.memory are read here", r.Resource)
	}
	if !ok {
		return "", fmt.Errorf("%s is unset", r.Resource)
	}
	div := int64(1)
	if !r.Divisor.IsZero() {
		div = r.Divisor.Value()
	}
	return strconv.FormatInt(int64(math.Ceil(float64(q.Value())/float64(div))), 10), nil
}

// parseGOMEMLIMIT reads GOMEMLIMIT as the Go runtime does: a number of
// bytes with an optional unit B, KiB, MiB, GiB or TiB (a bare number is
// bytes).
func parseGOMEMLIMIT(s string) (int64, error) {
	units := []struct {
		suffix string
		mult   int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"B", 1}}
	mult := int64(1)
	num := s
	for _, u := range units {
		if strings.HasSuffix(s, u.suffix) {
			mult, num = u.mult, strings.TrimSuffix(s, u.suffix)
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n <= 0 {
		return 0, errors.New("want a positive number of bytes with an optional unit B, KiB, MiB, GiB or TiB (e.g. 288MiB)")
	}
	return n * mult, nil
}

// mib formats a byte count in MiB, to a tenth (in bytes below 1 MiB).
func mib(n int64) string {
	if n < 1<<20 {
		return strconv.FormatInt(n, 10) + " B"
	}
	return strconv.FormatFloat(float64(n)/(1<<20), 'f', 1, 64) + " MiB"
}
