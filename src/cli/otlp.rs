//! Exports Ferry's spans (`ferry_runtime::telemetry`) over OTLP/HTTP when the standard
//! `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set; the
//! other `OTEL_*` variables (headers, timeout, `OTEL_SERVICE_NAME`) apply as usual.
//! `service.name` is `ferry-<command>`, and for a worker `ferry-<kind>` (`ferry worker
//! deploy` reports `ferry-deploy`), unless `OTEL_SERVICE_NAME` says otherwise.

use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;

/// The `service.name` of a command's spans: its kind's for a worker, else the command's.
pub fn service_name(command: &super::Command) -> String {
    match command {
        super::Command::Worker(a) => format!("ferry-{}", a.kind),
        c => format!("ferry-{}", c.name()),
    }
}

/// The installed provider, to flush at exit; None when OTLP is not configured. `service`:
/// the default `service.name` (see [`service_name`]).
pub fn init(service: &str) -> anyhow::Result<Option<SdkTracerProvider>> {
    let configured = ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"].iter().any(|v| std::env::var_os(v).is_some_and(|s| !s.is_empty()));
    if !configured {
        return Ok(None);
    }
    use opentelemetry_otlp::WithExportConfig;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
        .build()?;
    let service = std::env::var("OTEL_SERVICE_NAME").ok().filter(|s| !s.is_empty()).unwrap_or_else(|| service.to_owned());
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(Resource::builder().with_service_name(service).build())
        .build();
    opentelemetry::global::set_tracer_provider(provider.clone());
    Ok(Some(provider))
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    #[test]
    fn a_worker_reports_its_kind_as_its_service() {
        let name = |args: &[&str]| super::service_name(&super::super::Cli::parse_from(args).command);
        assert_eq!(name(&["ferry", "worker", "deploy"]), "ferry-deploy");
        assert_eq!(name(&["ferry", "worker", "create-cluster"]), "ferry-create-cluster");
        assert_eq!(name(&["ferry", "dev"]), "ferry-dev");
        assert_eq!(name(&["ferry", "tasks", "list"]), "ferry-tasks");
    }
}
