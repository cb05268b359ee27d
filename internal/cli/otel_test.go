package cli

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestTracingFromEnv(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		env     map[string]string
		on      bool
		wantErr string
	}{
		{"nothing set", nil, false, ""},
		{"endpoint", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, true, ""},
		{"traces endpoint", map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, true, ""},
		{"exporter otlp", map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, true, ""},
		{"exporter none", map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, false, ""},
		{"sdk disabled", map[string]string{"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, false, ""},
		{"console", map[string]string{"OTEL_TRACES_EXPORTER": "console"}, false, "otlp only"},
		{"grpc", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, false, "http/protobuf only"},
	}
	for _, tt := range tests {
		tp, shutdown, err := tracingFromEnv(t.Context(), func(k string) string { return tt.env[k] })
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("%s: error %v, want %q", tt.name, err, tt.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tt.name, err)
			continue
		}
		if (tp != nil) != tt.on {
			t.Errorf("%s: tracing on = %v, want %v", tt.name, tp != nil, tt.on)
		}
		if err := shutdown(t.Context()); err != nil {
			t.Errorf("%s: shutdown: %v", tt.name, err)
		}
	}
}

// TestOTelErrorsAreSampled: the SDK's errors go to idem's log, one line per
// interval with the count of those left out, not one line per error.
func TestOTelErrorsAreSampled(t *testing.T) {
	var buf bytes.Buffer
	now := time.Unix(1000, 0)
	h := &otelErrors{log: slog.New(slog.NewTextHandler(&buf, nil)), every: 10 * time.Second, now: func() time.Time { return now }}
	for range 100 {
		h.Handle(errors.New("baggage: too long"))
	}
	now = now.Add(10 * time.Second)
	h.Handle(errors.New("exporter: connection refused"))
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("%d log lines, want 2:\n%s", len(lines), buf.String())
	}
	if !strings.Contains(lines[0], "baggage: too long") || !strings.Contains(lines[0], "left_out=0") {
		t.Errorf("first line: %s", lines[0])
	}
	if !strings.Contains(lines[1], "connection refused") || !strings.Contains(lines[1], "left_out=99") {
		t.Errorf("second line: %s", lines[1])
	}
}
