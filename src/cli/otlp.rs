//! Exports Ferry's spans (`ferry_runtime::telemetry`) over OTLP/HTTP when the standard
//! `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set; the
//! other `OTEL_*` variables (headers, timeout, `OTEL_SERVICE_NAME`) apply as usual.

use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;

/// The installed provider, to flush at exit; None when OTLP is not configured.
pub fn init(command: &str) -> anyhow::Result<Option<SdkTracerProvider>> {
    let configured = ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"].iter().any(|v| std::env::var_os(v).is_some_and(|s| !s.is_empty()));
    if !configured {
        return Ok(None);
    }
    use opentelemetry_otlp::WithExportConfig;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
        .build()?;
    let service = std::env::var("OTEL_SERVICE_NAME").unwrap_or_else(|_| format!("ferry-{command}"));
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(Resource::builder().with_service_name(service).build())
        .build();
    opentelemetry::global::set_tracer_provider(provider.clone());
    Ok(Some(provider))
}
