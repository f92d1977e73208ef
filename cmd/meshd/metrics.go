package main

import (
	"fmt"
	"net/http"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"

	"github.com/meshkit/mesh/runtime"
)

// buildInfoGauge is mesh_build_info: always 1, labelled with what the node
// runs (its release, commit and Go toolchain) and the module protocols it
// serves, as Prometheus' own *_build_info gauges are, so a dashboard can
// count the nodes of each release during an upgrade.
func buildInfoGauge(node string, b runtime.BuildInfo) prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "mesh_build_info",
		Help: "The mesh release, commit and Go version meshd was built from, and the module protocols it serves; always 1.",
		ConstLabels: prometheus.Labels{
			"node": node, "release": b.Release, "commit": b.Commit, "goversion": b.GoVersion,
			"module_protocol_min": strconv.FormatUint(uint64(b.ModuleProtocols.Min), 10),
			"module_protocol_max": strconv.FormatUint(uint64(b.ModuleProtocols.Max), 10),
		},
	}, func() float64 { return 1 })
}

// metricsProvider is the node's OpenTelemetry meter provider, exported for
// Prometheus: its handler serves /metrics. Every metric is labelled with
// the node (a resource attribute made a constant label), beside the Go
// runtime's and the process's own metrics.
func metricsProvider(node string) (*sdkmetric.MeterProvider, http.Handler, error) {
	reg := prometheus.NewRegistry()
	if err := reg.Register(collectors.NewGoCollector()); err != nil {
		return nil, nil, fmt.Errorf("metrics: %w", err)
	}
	if err := reg.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})); err != nil {
		return nil, nil, fmt.Errorf("metrics: %w", err)
	}
	if err := reg.Register(buildInfoGauge(node, runtime.Build())); err != nil {
		return nil, nil, fmt.Errorf("metrics: %w", err)
	}
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg),
		otelprom.WithResourceAsConstantLabels(func(kv attribute.KeyValue) bool { return kv.Key == "node" }))
	if err != nil {
		return nil, nil, fmt.Errorf("metrics: %w", err)
	}
	res := resource.NewSchemaless(attribute.String("node", node), attribute.String("service.name", "meshd"))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter), sdkmetric.WithResource(res))
	return mp, promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), nil
}
