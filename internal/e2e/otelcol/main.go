// abx-otelcol is a small OpenTelemetry Collector for agentbox's e2e suite:
// the collector's own service and its real OTLP receiver (OTLP/HTTP), with
// one exporter of its own that appends every log record it receives, as
// the collector's plog JSON, to a file. The suite points the shim's OTLP
// sink at it and reads the file back.
//
// It is its own module (go.mod here) so that the collector's dependencies
// stay out of agentbox's.
package main

import (
	"context"
	"fmt"
	"os"
	"sync"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/confmap/provider/fileprovider"
	"go.opentelemetry.io/collector/exporter"
	"go.opentelemetry.io/collector/exporter/exporterhelper"
	"go.opentelemetry.io/collector/otelcol"
	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/receiver"
	"go.opentelemetry.io/collector/receiver/otlpreceiver"
	"go.opentelemetry.io/collector/service/telemetry/otelconftelemetry"
)

// Config is the exporter's: the file it appends to.
type Config struct {
	Path string `mapstructure:"path"`
}

var typ = component.MustNewType("abxfile")

func newExporterFactory() exporter.Factory {
	return exporter.NewFactory(typ,
		func() component.Config { return &Config{} },
		exporter.WithLogs(createLogs, component.StabilityLevelDevelopment))
}

func createLogs(ctx context.Context, set exporter.Settings, cfg component.Config) (exporter.Logs, error) {
	c := cfg.(*Config)
	if c.Path == "" {
		return nil, fmt.Errorf("abxfile: path is required")
	}
	var mu sync.Mutex
	marshaler := &plog.JSONMarshaler{}
	push := func(_ context.Context, ld plog.Logs) error {
		b, err := marshaler.MarshalLogs(ld)
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		f, err := os.OpenFile(c.Path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = f.Write(append(b, '\n'))
		return err
	}
	return exporterhelper.NewLogs(ctx, set, cfg, push)
}

func main() {
	factories := func() (otelcol.Factories, error) {
		return otelcol.Factories{
			Receivers: map[component.Type]receiver.Factory{otlpreceiver.NewFactory().Type(): otlpreceiver.NewFactory()},
			Exporters: map[component.Type]exporter.Factory{typ: newExporterFactory()},
			Telemetry: otelconftelemetry.NewFactory(),
		}, nil
	}
	set := otelcol.CollectorSettings{
		BuildInfo: component.BuildInfo{Command: "abx-otelcol", Description: "agentbox e2e collector", Version: "0.165.0"},
		Factories: factories,
		ConfigProviderSettings: otelcol.ConfigProviderSettings{ResolverSettings: confmap.ResolverSettings{
			ProviderFactories: []confmap.ProviderFactory{fileprovider.NewFactory()},
			DefaultScheme:     "file",
		}},
	}
	if err := otelcol.NewCommand(set).Execute(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
