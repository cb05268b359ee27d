package cli

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
	"go.opentelemetry.io/otel/trace"
)

// tracingFromEnv returns a tracer provider exporting spans over OTLP
// (http/protobuf), configured by the standard OpenTelemetry environment
// variables, or nil when they do not ask for one: tracing is on when
// OTEL_TRACES_EXPORTER is otlp, or unset with an OTLP endpoint
// (OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) set,
// and off with OTEL_TRACES_EXPORTER=none or OTEL_SDK_DISABLED=true. The
// exporter reads the rest (headers, timeout, TLS), the SDK the sampler
// (OTEL_TRACES_SAMPLER) and the resource (OTEL_SERVICE_NAME, default idem;
// OTEL_RESOURCE_ATTRIBUTES). shutdown flushes the spans not yet sent.
func tracingFromEnv(ctx context.Context, getenv func(string) string) (tp trace.TracerProvider, shutdown func(context.Context) error, err error) {
	off := func(context.Context) error { return nil }
	if strings.EqualFold(getenv("OTEL_SDK_DISABLED"), "true") {
		return nil, off, nil
	}
	switch exp := strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER")); exp {
	case "none":
		return nil, off, nil
	case "":
		if getenv("OTEL_EXPORTER_OTLP_ENDPOINT") == "" && getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "" {
			return nil, off, nil
		}
	case "otlp":
	default:
		return nil, nil, fmt.Errorf("OTEL_TRACES_EXPORTER=%s: idem exports traces with otlp only (or none)", exp)
	}
	for _, name := range []string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
		if p := getenv(name); p != "" && p != "http/protobuf" {
			return nil, nil, fmt.Errorf("%s=%s: idem exports traces over http/protobuf only", name, p)
		}
	}
	exporter, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("OTLP trace exporter: %w", err)
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(semconv.ServiceName("idem")), // OTEL_SERVICE_NAME overrides it
		resource.WithFromEnv(), resource.WithTelemetrySDK())
	if err != nil {
		return nil, nil, fmt.Errorf("OpenTelemetry resource: %w", err)
	}
	sdk := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exporter), sdktrace.WithResource(res))
	return sdk, sdk.Shutdown, nil
}

// logTracing says at startup whether spans are exported, and where.
func logTracing(log *slog.Logger, tp trace.TracerProvider) {
	if tp == nil {
		return
	}
	endpoint := os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
	if endpoint == "" {
		endpoint = os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT")
	}
	if endpoint == "" {
		endpoint = "http://localhost:4318 (the OTLP default)"
	}
	log.Info("tracing: spans exported over OTLP", slog.String("endpoint", endpoint))
}

// otelErrors sends the OpenTelemetry SDK's own errors (an exporter that
// cannot reach its collector, a client's baggage over the limits) to log
// instead of stderr, at most one line per every, with the number of
// errors left out since the last line, so that no client can flood the
// log with headers that fail to parse.
type otelErrors struct {
	log   *slog.Logger
	every time.Duration
	now   func() time.Time

	mu      sync.Mutex
	last    time.Time
	skipped int
}

// Handle implements otel.ErrorHandler.
func (h *otelErrors) Handle(err error) {
	h.mu.Lock()
	now := h.now()
	if !h.last.IsZero() && now.Sub(h.last) < h.every {
		h.skipped++
		h.mu.Unlock()
		return
	}
	skipped := h.skipped
	h.last, h.skipped = now, 0
	h.mu.Unlock()
	h.log.Warn("tracing: OpenTelemetry error", slog.Any("error", err), slog.Int("left_out", skipped))
}

// routeOTelErrors installs otelErrors for log, process-wide.
func routeOTelErrors(log *slog.Logger) {
	otel.SetErrorHandler(&otelErrors{log: log, every: 10 * time.Second, now: time.Now})
}
