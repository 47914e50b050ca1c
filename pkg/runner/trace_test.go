package runner_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/tidemark/tidemark/pkg/runner"
	"github.com/tidemark/tidemark/pkg/runner/runnertest"
)

const group = "orders-workers"

// groupedSource is a runnertest source that is a member of group: the
// runner learns it through runner.Grouped.
type groupedSource struct{ *runnertest.Source }

func (groupedSource) Group() string { return group }

// rejectedError is a handler's error; its error.type is its Go type.
type rejectedError struct{}

func (*rejectedError) Error() string { return "rejected" }

// kvs renders attributes as sorted "key=TYPE:value" strings, so that a
// comparison checks each attribute's name, type and value and shows the
// difference.
func kvs(attrs []attribute.KeyValue) []string {
	out := make([]string, len(attrs))
	for i, kv := range attrs {
		out[i] = fmt.Sprintf("%s=%s:%s", kv.Key, kv.Value.Type(), kv.Value.Emit())
	}
	slices.Sort(out)
	return out
}

// spanAttrs is what every span of topic t's partition p carries, with the
// record's offset and more.
func spanAttrs(p int32, offset int64, more ...string) []string {
	out := append([]string{
		"messaging.system=STRING:kafka",
		"messaging.operation.type=STRING:process",
		"messaging.operation.name=STRING:process",
		"messaging.consumer.group.name=STRING:" + group,
		"messaging.destination.name=STRING:" + topic,
		fmt.Sprintf("messaging.destination.partition.id=STRING:%d", p),
		fmt.Sprintf("messaging.kafka.offset=INT64:%d", offset),
	}, more...)
	slices.Sort(out)
	return out
}

// TestSpanPerRecordByTheConventions: each record gets one CONSUMER span
// "process <topic>" with the messaging conventions' attributes, by their
// names and types: messaging.kafka.message.key only for a key that is
// UTF-8 text, tidemark.record.delivery_count for a counted delivery; a
// record that fails every attempt ends with status Error, error.type and
// one exception event per failed attempt; a record handled is Unset. The
// handler's ctx carries the span.
func TestSpanPerRecordByTheConventions(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		exp := tracetest.NewInMemoryExporter()
		prov := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
		defer prov.Shutdown(context.Background())
		src := groupedSource{runnertest.New()}
		src.Append(
			runner.Record{Topic: topic, Partition: 0, Offset: 0, Key: []byte("order-1")},
			runner.Record{Topic: topic, Partition: 0, Offset: 1, Key: []byte{0xff, 0xfe, 0x00}},
			runner.Record{Topic: topic, Partition: 0, Offset: 2},
			runner.Record{Topic: topic, Partition: 0, Offset: 3, Key: []byte("poison")},
			runner.Record{Topic: topic, Partition: 1, Offset: 0, Key: []byte("order-2"), DeliveryCount: 2},
		)
		var mu sync.Mutex
		seen := map[string]trace.SpanContext{} // the handler's ctx's span, by record
		r := newRunner(t, src, runner.Handle(topic, func(ctx context.Context, rec runner.Record) error {
			mu.Lock()
			seen[rec.String()] = trace.SpanContextFromContext(ctx)
			mu.Unlock()
			if string(rec.Key) == "poison" {
				return fmt.Errorf("order poison: %w", &rejectedError{})
			}
			return nil
		}), runner.TracerProvider(prov), runner.Failure(runner.Skip(2)), runner.CommitInterval(2*time.Millisecond))
		started(t, r)
		assign(t, src.Source, tp(0), tp(1))
		await(t, 5*time.Second, "every record committed", func() bool {
			return committedAt(src.Source, 0, 4)() && committedAt(src.Source, 1, 1)()
		})
		want := map[string][]string{
			"t/0@0": spanAttrs(0, 0, "messaging.kafka.message.key=STRING:order-1"),
			"t/0@1": spanAttrs(0, 1), // binary key: none
			"t/0@2": spanAttrs(0, 2), // no key: none
			"t/0@3": spanAttrs(0, 3, "messaging.kafka.message.key=STRING:poison", "error.type=STRING:*runner_test.rejectedError"),
			"t/1@0": spanAttrs(1, 0, "messaging.kafka.message.key=STRING:order-2", "tidemark.record.delivery_count=INT64:2"),
		}
		spans := exp.GetSpans()
		if len(spans) != len(want) {
			t.Fatalf("%d spans ended, want %d", len(spans), len(want))
		}
		for _, s := range spans {
			var p int32
			var off int64
			for _, kv := range s.Attributes {
				switch kv.Key {
				case "messaging.destination.partition.id":
					fmt.Sscan(kv.Value.AsString(), &p)
				case "messaging.kafka.offset":
					off = kv.Value.AsInt64()
				}
			}
			id := fmt.Sprintf("t/%d@%d", p, off)
			if s.Name != "process "+topic || s.SpanKind != trace.SpanKindConsumer {
				t.Errorf("%s: span %q of kind %v, want %q of kind consumer", id, s.Name, s.SpanKind, "process "+topic)
			}
			if got := kvs(s.Attributes); !slices.Equal(got, want[id]) {
				t.Errorf("%s: span attributes\n%s\nwant\n%s", id, strings.Join(got, "\n"), strings.Join(want[id], "\n"))
			}
			if s.Parent.IsValid() || len(s.Links) != 0 {
				t.Errorf("%s: parent %v and %d links, want a root span without links (no trace headers)", id, s.Parent, len(s.Links))
			}
			mu.Lock()
			if sc := seen[id]; !sc.Equal(s.SpanContext) {
				t.Errorf("%s: the handler's ctx carries span %v, want the record's span %v", id, sc.SpanID(), s.SpanContext.SpanID())
			}
			mu.Unlock()
			if id == "t/0@3" {
				if s.Status.Code != codes.Error || s.Status.Description != "skipped" {
					t.Errorf("%s: status %v %q, want Error \"skipped\"", id, s.Status.Code, s.Status.Description)
				}
				if n := len(s.Events); n != 2 || s.Events[0].Name != "exception" {
					t.Errorf("%s: %d events (%v), want 2 exception events, one per failed attempt", id, n, s.Events)
				}
				continue
			}
			if s.Status.Code != codes.Unset || len(s.Events) != 0 {
				t.Errorf("%s: status %v and %d events, want Unset and none", id, s.Status.Code, len(s.Events))
			}
		}
	})
}

// TestSpanParentAndLinkFromHeaders: with a composite propagator (W3C
// trace context and baggage) installed globally, a record's creation
// context in its traceparent header is its span's parent and its link,
// its baggage reaches the handler's ctx, and the span of Run's ctx
// (ambient) is linked; a record without headers is a child of the
// ambient span, with no link; an invalid traceparent is ignored.
func TestSpanParentAndLinkFromHeaders(t *testing.T) {
	isolated(t, func(t *testing.T) {
		prev := otel.GetTextMapPropagator()
		otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
		t.Cleanup(func() { otel.SetTextMapPropagator(prev) })
		synctest.Test(t, func(t *testing.T) {
			exp := tracetest.NewInMemoryExporter()
			prov := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
			defer prov.Shutdown(context.Background())
			const traceID, spanID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
			src := groupedSource{runnertest.New()}
			src.Append(
				runner.Record{Topic: topic, Offset: 0, Key: []byte("a"), Headers: []runner.Header{
					{Key: "traceparent", Value: []byte("00-" + traceID + "-" + spanID + "-01")},
					{Key: "baggage", Value: []byte("tenant=acme")},
				}},
				runner.Record{Topic: topic, Offset: 1, Key: []byte("b")},
				runner.Record{Topic: topic, Offset: 2, Key: []byte("c"), Headers: []runner.Header{
					{Key: "traceparent", Value: []byte("not a traceparent")},
				}},
			)
			var mu sync.Mutex
			tenants := map[int64]string{}
			r := newRunner(t, src, runner.Handle(topic, func(ctx context.Context, rec runner.Record) error {
				mu.Lock()
				tenants[rec.Offset] = baggage.FromContext(ctx).Member("tenant").Value()
				mu.Unlock()
				return nil
			}), runner.TracerProvider(prov), runner.CommitInterval(2*time.Millisecond))
			ambient := trace.NewSpanContext(trace.SpanContextConfig{
				TraceID: trace.TraceID{1}, SpanID: trace.SpanID{2}, TraceFlags: trace.FlagsSampled})
			errc := make(chan error, 1)
			go func() { errc <- r.Run(trace.ContextWithSpanContext(context.Background(), ambient)) }()
			defer func() {
				r.Close()
				if err := <-errc; err != nil {
					t.Errorf("Run: %v", err)
				}
			}()
			assign(t, src.Source, tp(0))
			await(t, time.Second, "every record committed", committedAt(src.Source, 0, 3))
			spans := exp.GetSpans()
			if len(spans) != 3 {
				t.Fatalf("%d spans ended, want 3", len(spans))
			}
			for _, s := range spans {
				var off int64 = -1
				for _, kv := range s.Attributes {
					if kv.Key == "messaging.kafka.offset" {
						off = kv.Value.AsInt64()
					}
				}
				var links []string
				for _, l := range s.Links {
					links = append(links, l.SpanContext.TraceID().String()+"/"+l.SpanContext.SpanID().String())
				}
				parent := s.Parent.TraceID().String() + "/" + s.Parent.SpanID().String()
				ambientID := ambient.TraceID().String() + "/" + ambient.SpanID().String()
				switch off {
				case 0:
					if parent != traceID+"/"+spanID || !s.Parent.IsRemote() {
						t.Errorf("record 0: parent %s (remote %v), want the traceparent's %s/%s", parent, s.Parent.IsRemote(), traceID, spanID)
					}
					if want := []string{traceID + "/" + spanID, ambientID}; !slices.Equal(links, want) {
						t.Errorf("record 0: links %v, want the creation context and the ambient span %v", links, want)
					}
				case 1, 2:
					if parent != ambientID || len(links) != 0 {
						t.Errorf("record %d: parent %s and links %v, want the ambient span %s and no link", off, parent, links, ambientID)
					}
				default:
					t.Errorf("a span without a known offset: %v", kvs(s.Attributes))
				}
			}
			mu.Lock()
			defer mu.Unlock()
			if want := map[int64]string{0: "acme", 1: "", 2: ""}; !mapsEqual(tenants, want) {
				t.Errorf("the handlers saw baggage tenant %v, want %v", tenants, want)
			}
		})
	})
}

// TestTracerProviderInstalledAfterNew: a runner on the global tracer
// provider follows it: records handled before an SDK is installed get no
// span, and once one is installed (after New, after Run began) the next
// record gets its span.
func TestTracerProviderInstalledAfterNew(t *testing.T) {
	isolated(t, func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			src := groupedSource{runnertest.New()}
			src.Append(runner.Record{Topic: topic, Offset: 0, Key: []byte("before")})
			r := newRunner(t, src, runner.Handle(topic, func(context.Context, runner.Record) error { return nil }),
				runner.CommitInterval(2*time.Millisecond))
			started(t, r)
			assign(t, src.Source, tp(0))
			await(t, time.Second, "the first record committed", committedAt(src.Source, 0, 1))

			exp := tracetest.NewInMemoryExporter()
			prov := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
			defer prov.Shutdown(context.Background())
			otel.SetTracerProvider(prov)
			src.Append(runner.Record{Topic: topic, Offset: 1, Key: []byte("after")})
			await(t, time.Second, "the second record committed", committedAt(src.Source, 0, 2))
			spans := exp.GetSpans()
			if len(spans) != 1 {
				t.Fatalf("%d spans, want 1: the record handled after the SDK was installed", len(spans))
			}
			if got := kvs(spans[0].Attributes); !slices.Equal(got, spanAttrs(0, 1, "messaging.kafka.message.key=STRING:after")) {
				t.Errorf("span attributes %v, want record t/0@1's", got)
			}
		})
	})
}

func mapsEqual[K comparable, V comparable](a, b map[K]V) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// isolatedEnv names the test a child process of the test binary runs.
const isolatedEnv = "TIDEMARK_TEST_ISOLATED"

// isolated runs body in a child process of the test binary, which runs
// only t. Body sets OpenTelemetry's global providers: the global
// placeholders delegate to the first provider set, once, and cannot be
// restored, so in this process they would change what the other tests
// measure (TestRecordTelemetryAllocatesNothingWhenTracingIsOff needs them
// untouched).
func isolated(t *testing.T, body func(t *testing.T)) {
	t.Helper()
	if os.Getenv(isolatedEnv) == t.Name() {
		body(t)
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^"+regexp.QuoteMeta(t.Name())+"$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), isolatedEnv+"="+t.Name())
	if _, set := os.LookupEnv("GORACE"); !set {
		// The race detector's exit waits a second by default.
		cmd.Env = append(cmd.Env, "GORACE=atexit_sleep_ms=0")
	}
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("starting the child process: %v", err)
	}
	if err != nil || !strings.Contains(string(out), "--- PASS: "+t.Name()) {
		t.Fatalf("in a child process (%v):\n%s", err, out)
	}
}
