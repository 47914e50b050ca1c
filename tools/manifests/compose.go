package manifests

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/tidemark/tidemark/pkg/shutdown"
)

// Compose is the part of a docker-compose.yml the check reads. It is not
// decoded strictly: the Compose specification is not in k8s.io/api, and a
// field this check does not know is not an error.
type Compose struct {
	Services map[string]ComposeService `json:"services"`
}

// ComposeService is one service of a Compose file.
type ComposeService struct {
	Image       string      `json:"image"`
	Hostname    string      `json:"hostname"`
	NetworkMode string      `json:"network_mode"`
	Environment Environment `json:"environment"`
	Ports       []string    `json:"ports"`
	StopGrace   string      `json:"stop_grace_period"`
	DependsOn   DependsOn   `json:"depends_on"`
	Command     []string    `json:"command"`
}

// Environment is a service's environment, written as a map or as a list
// of NAME=value.
type Environment map[string]string

func (e *Environment) UnmarshalJSON(b []byte) error {
	*e = Environment{}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err == nil {
		for k, v := range m {
			if v == nil {
				(*e)[k] = ""
			} else {
				(*e)[k] = fmt.Sprint(v)
			}
		}
		return nil
	}
	var l []string
	if err := json.Unmarshal(b, &l); err != nil {
		return errors.New("environment: want a map or a list of NAME=value")
	}
	for _, kv := range l {
		k, v, _ := strings.Cut(kv, "=")
		(*e)[k] = v
	}
	return nil
}

// DependsOn is a service's depends_on: service → condition, written as a
// list (condition service_started) or as a map.
type DependsOn map[string]string

func (d *DependsOn) UnmarshalJSON(b []byte) error {
	*d = DependsOn{}
	var m map[string]struct {
		Condition string `json:"condition"`
	}
	if err := json.Unmarshal(b, &m); err == nil {
		for k, v := range m {
			(*d)[k] = v.Condition
		}
		return nil
	}
	var l []string
	if err := json.Unmarshal(b, &l); err != nil {
		return errors.New("depends_on: want a map or a list of services")
	}
	for _, s := range l {
		(*d)[s] = "service_started"
	}
	return nil
}

// LoadCompose reads a Compose file, interpolating ${VAR}, ${VAR:-default}
// and ${VAR-default} from vars (not from the process's environment: the
// check must not depend on who runs it).
func LoadCompose(path string, vars map[string]string) (*Compose, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return DecodeCompose(b, vars)
}

var interpolation = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?-)([^}]*))?\}`)

// DecodeCompose decodes a Compose file's content; see LoadCompose.
func DecodeCompose(b []byte, vars map[string]string) (*Compose, error) {
	s := interpolation.ReplaceAllStringFunc(string(b), func(m string) string {
		g := interpolation.FindStringSubmatch(m)
		v, ok := vars[g[1]]
		switch {
		case g[2] == ":-" && (!ok || v == ""):
			return g[3]
		case g[2] == "-" && !ok:
			return g[3]
		}
		return v
	})
	js, err := yaml.YAMLToJSONStrict([]byte(s))
	if err != nil {
		return nil, err
	}
	var c Compose
	if err := json.Unmarshal(js, &c); err != nil {
		return nil, err
	}
	return &c, nil
}

// postgresPort is the port the postgres image listens on in its container.
const postgresPort = "5432"

// CheckOrders checks that the Compose file's service svc (the orders
// example) reaches the broker and the database it defines: its broker
// address is a Kafka listener of another service, advertised under the same
// address (a client connects to the advertised address once bootstrapped,
// so an address only the host can resolve would fail from the container);
// its database host is the postgres service; it waits for both to be
// healthy; and its stop grace period covers the shutdown budget.
func (c *Compose) CheckOrders(svc string) error {
	o, ok := c.Services[svc]
	if !ok {
		return fmt.Errorf("services.%s: no such service", svc)
	}
	var errs []error
	fail := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("services.%s: %s", svc, fmt.Sprintf(format, args...)))
	}
	hostNet := o.NetworkMode == "host"
	if o.NetworkMode != "" && !hostNet {
		fail("network_mode %q: the check knows the default network and host", o.NetworkMode)
	}

	brokers := o.Environment["TIDEMARK_KAFKA_BROKERS"]
	if brokers == "" {
		fail("environment.TIDEMARK_KAFKA_BROKERS is unset")
	}
	for _, addr := range strings.Split(brokers, ",") {
		addr = strings.TrimSpace(addr)
		name, err := c.kafkaFor(addr, hostNet)
		if err != nil {
			fail("environment.TIDEMARK_KAFKA_BROKERS %q: %v", addr, err)
			continue
		}
		if o.DependsOn[name] != "service_healthy" {
			fail("depends_on.%s: want condition service_healthy (the service exits when the broker cannot be reached at start)", name)
		}
	}

	if dsn := o.Environment["TIDEMARK_PG_DSN"]; dsn == "" {
		fail("environment.TIDEMARK_PG_DSN is unset")
	} else if u, err := url.Parse(dsn); err != nil || u.Host == "" {
		fail("environment.TIDEMARK_PG_DSN: not a postgres:// URL with a host")
	} else if name, err := c.postgresFor(u.Host, hostNet); err != nil {
		fail("environment.TIDEMARK_PG_DSN host %q: %v", u.Host, err)
	} else if o.DependsOn[name] != "service_healthy" {
		fail("depends_on.%s: want condition service_healthy", name)
	}

	budget := shutdown.DefaultBudget
	if v := o.Environment[envBudget]; v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			fail("environment.%s %q: not a positive duration", envBudget, v)
		}
		budget = d
	}
	grace := 10 * time.Second // Compose's default
	if o.StopGrace != "" {
		d, err := time.ParseDuration(o.StopGrace)
		if err != nil {
			fail("stop_grace_period %q: not a duration", o.StopGrace)
		}
		grace = d
	}
	if grace < budget+StopMargin {
		fail("stop_grace_period %s < %s %s + %s margin: Compose would kill the process (SIGKILL) before its stop ends", grace, envBudget, budget, StopMargin)
	}

	// The probes and /metrics: a published port must be the one the
	// process listens on.
	httpAddr := o.Environment[envHTTP]
	if httpAddr == "" {
		httpAddr = defHTTP
	}
	lh, lp, err := net.SplitHostPort(httpAddr)
	if err != nil {
		fail("environment.%s %q: not host:port", envHTTP, httpAddr)
	}
	if !hostNet && isLoopback(lh) {
		fail("environment.%s %q: the container's loopback cannot be reached through a published port; listen on :%s", envHTTP, httpAddr, lp)
	}
	for _, p := range o.Ports {
		if _, target := publishedPort(p); target != lp {
			fail("ports %q: the container port is not %s, where the service listens (%s)", p, lp, envHTTP)
		}
	}
	return errors.Join(errs...)
}

// CheckTopicJob checks that the service svc (the job that creates the
// orders topic with examples/orders/produce) reaches the broker through
// its -brokers argument and waits for it to be healthy.
func (c *Compose) CheckTopicJob(svc string) error {
	j, ok := c.Services[svc]
	if !ok {
		return fmt.Errorf("services.%s: no such service", svc)
	}
	for i, a := range j.Command {
		if a != "-brokers" || i+1 == len(j.Command) {
			continue
		}
		name, err := c.kafkaFor(j.Command[i+1], j.NetworkMode == "host")
		if err != nil {
			return fmt.Errorf("services.%s: command -brokers %q: %v", svc, j.Command[i+1], err)
		}
		if j.DependsOn[name] != "service_healthy" {
			return fmt.Errorf("services.%s: depends_on.%s: want condition service_healthy", svc, name)
		}
		return nil
	}
	return fmt.Errorf("services.%s: command has no -brokers argument", svc)
}

// kafkaFor finds the service whose Kafka listener addr reaches, and checks
// that the listener advertises addr itself.
func (c *Compose) kafkaFor(addr string, hostNet bool) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("not host:port")
	}
	for name, s := range c.Services {
		listeners := parseListeners(s.Environment["KAFKA_LISTENERS"])
		if len(listeners) == 0 {
			continue
		}
		var listener string // the listener's name
		switch {
		case hostNet:
			if host != "127.0.0.1" && host != "localhost" {
				return "", fmt.Errorf("with network_mode host the broker is on 127.0.0.1, not %s", host)
			}
			for _, p := range s.Ports {
				if pub, target := publishedPort(p); pub == port {
					for ln, la := range listeners {
						if _, lp, _ := net.SplitHostPort(la); lp == target {
							listener = ln
						}
					}
				}
			}
		case host == name || host == s.Hostname:
			for ln, la := range listeners {
				if _, lp, _ := net.SplitHostPort(la); lp == port {
					listener = ln
				}
			}
			if listener == "" {
				return "", fmt.Errorf("service %s has no listener on port %s (KAFKA_LISTENERS %q)", name, port, s.Environment["KAFKA_LISTENERS"])
			}
		default:
			continue
		}
		if listener == "" {
			continue
		}
		// Docker forwards a connection, from another container or a
		// published port, to the container's address on the network: a
		// listener bound to its loopback refuses it.
		if lh, _, _ := net.SplitHostPort(listeners[listener]); isLoopback(lh) {
			return "", fmt.Errorf("service %s's listener %s is bound to %q, its own container's loopback (KAFKA_LISTENERS): a connection from another container is refused; bind it to every interface (%s://:port)", name, listener, lh, listener)
		}
		// Kafka refuses to start with a listener that has no security
		// protocol, and the example speaks PLAINTEXT (no TLS, no SASL).
		if proto := securityProtocol(s.Environment, listener); proto != "PLAINTEXT" {
			if proto == "" {
				return "", fmt.Errorf("service %s's listener %s has no security protocol (KAFKA_LISTENER_SECURITY_PROTOCOL_MAP %q): Kafka refuses to start", name, listener, s.Environment["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"])
			}
			return "", fmt.Errorf("service %s's listener %s is %s (KAFKA_LISTENER_SECURITY_PROTOCOL_MAP): the example connects in PLAINTEXT", name, listener, proto)
		}
		adv := parseListeners(s.Environment["KAFKA_ADVERTISED_LISTENERS"])[listener]
		if adv != addr {
			return "", fmt.Errorf("service %s's listener %s advertises %q (KAFKA_ADVERTISED_LISTENERS), not %q: after bootstrapping, the client would connect to %q", name, listener, adv, addr, adv)
		}
		return name, nil
	}
	if hostNet {
		return "", fmt.Errorf("no service publishes a Kafka listener on 127.0.0.1:%s", port)
	}
	return "", fmt.Errorf("no service named %q with Kafka listeners: the container could not resolve it", host)
}

// postgresFor finds the postgres service hostport reaches.
func (c *Compose) postgresFor(hostport string, hostNet bool) (string, error) {
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		host, port = hostport, postgresPort
	}
	for name, s := range c.Services {
		if !strings.HasPrefix(s.Image, "postgres") {
			continue
		}
		if hostNet {
			for _, p := range s.Ports {
				if pub, target := publishedPort(p); pub == port && target == postgresPort && (host == "127.0.0.1" || host == "localhost") {
					return name, nil
				}
			}
			continue
		}
		if host == name || host == s.Hostname {
			if port != postgresPort {
				return "", fmt.Errorf("service %s listens on %s in its container, not %s", name, postgresPort, port)
			}
			return name, nil
		}
	}
	return "", errors.New("no postgres service reachable at that address")
}

// isLoopback reports whether host is a loopback address or localhost.
func isLoopback(host string) bool {
	ip := net.ParseIP(host)
	return strings.EqualFold(host, "localhost") || (ip != nil && ip.IsLoopback())
}

// securityProtocol is the security protocol of a Kafka listener: its
// entry in KAFKA_LISTENER_SECURITY_PROTOCOL_MAP, or, when that is unset,
// Kafka's default map (each protocol a listener of its own name); "" when
// it has none.
func securityProtocol(env Environment, listener string) string {
	m, ok := env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"]
	if !ok || m == "" {
		m = "PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL"
	}
	for _, kv := range strings.Split(m, ",") {
		if k, v, ok := strings.Cut(strings.TrimSpace(kv), ":"); ok && k == listener {
			return v
		}
	}
	return ""
}

// parseListeners reads a listeners setting, NAME://host:port,...
func parseListeners(s string) map[string]string {
	m := map[string]string{}
	for _, l := range strings.Split(s, ",") {
		if name, addr, ok := strings.Cut(strings.TrimSpace(l), "://"); ok {
			m[name] = addr
		}
	}
	return m
}

// publishedPort reads a short-syntax port, [ip:]published:target[/proto].
func publishedPort(p string) (published, target string) {
	p, _, _ = strings.Cut(p, "/")
	parts := strings.Split(p, ":")
	target = parts[len(parts)-1]
	if len(parts) >= 2 {
		published = parts[len(parts)-2]
	}
	if _, err := strconv.Atoi(target); err != nil {
		target = ""
	}
	return published, target
}
