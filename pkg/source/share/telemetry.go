package share

import (
	"context"
	"errors"
	"strconv"

	"github.com/twmb/franz-go/pkg/kerr"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
)

// instrumentation is the source's meter name.
const instrumentation = "github.com/tidemark/tidemark/pkg/source/share"

// telemetry is the source's own measurements: what the runner cannot see.
type telemetry struct {
	group string
	// acksRefused counts the acknowledgements of a partition the broker
	// refused or the client could not deliver (franz-go's ack callback):
	// their records come back, a handled one runs again.
	acksRefused metric.Int64Counter
}

func newTelemetry(mp metric.MeterProvider, group string) (*telemetry, error) {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	m := mp.Meter(instrumentation, metric.WithSchemaURL(semconv.SchemaURL))
	c, err := m.Int64Counter("tidemark.share.acks_refused", metric.WithUnit("{acknowledgement}"),
		metric.WithDescription("Acknowledgements of a partition (accepts, rejects, releases and renewals sent together) that the broker refused or the client could not deliver; their records are delivered again, a handled one runs again. error.type names the Kafka error."))
	if err != nil {
		return nil, err
	}
	return &telemetry{group: group, acksRefused: c}, nil
}

// refused counts one refused acknowledgement of topic/partition.
func (t *telemetry) refused(topic string, partition int32, err error) {
	t.acksRefused.Add(context.Background(), 1, metric.WithAttributes(
		semconv.MessagingConsumerGroupName(t.group),
		semconv.MessagingDestinationName(topic),
		semconv.MessagingDestinationPartitionID(strconv.Itoa(int(partition))),
		attribute.String("error.type", errorType(err)),
	))
}

// errorType is the Kafka error's name (INVALID_RECORD_STATE), or
// "_OTHER" for an error the client raised (a request that failed).
func errorType(err error) string {
	var ke *kerr.Error
	if errors.As(err, &ke) {
		return ke.Message
	}
	return "_OTHER"
}
