//! Log lines on stderr: text for people, or JSON objects, one a line (`--log-format json`),
//! where the lines of a task's work carry the `trace_id` and `span_id` of its span.

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::Subscriber;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::{LookupSpan, SpanRef};
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// How log lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One human-readable line per event.
    #[default]
    Text,
    /// One JSON object per line: `timestamp`, `level`, `target`, the event's fields
    /// (`message` among them), `span` and `spans`, and inside a task `trace_id` and `span_id`.
    Json,
}

/// Installs the process's logger: `filter` in `RUST_LOG` syntax, lines in `format`.
pub fn init(filter: &str, format: LogFormat) {
    // Only the first logger of the process is installed (tests may start several).
    match format {
        LogFormat::Text => {
            let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
        }
        LogFormat::Json => {
            let _ = tracing_subscriber::registry().with(EnvFilter::new(filter)).with(TraceIdsLayer).with(json_layer()).try_init();
        }
    }
}

fn json_layer<S>() -> json_subscriber::JsonLayer<S, fn() -> std::io::Stderr>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    let mut layer = json_subscriber::JsonLayer::stderr();
    layer.with_timer("timestamp", tracing_subscriber::fmt::time::SystemTime);
    layer.with_level("level");
    layer.with_target("target");
    layer.with_flattened_event();
    layer.with_current_span("span");
    layer.with_span_list("spans");
    layer.add_from_span("trace_id", |span| trace_ids(span).map(|ids| ids.trace_id));
    layer.add_from_span("span_id", |span| trace_ids(span).map(|ids| ids.span_id));
    layer
}

/// The ids the nearest span that has them names (the event's own span first).
fn trace_ids<S>(span: &SpanRef<'_, S>) -> Option<TraceIds>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    span.scope().find_map(|s| s.extensions().get::<TraceIds>().filter(|ids| ids.complete()).cloned())
}

/// The OpenTelemetry trace and span a `tracing` span names in its `trace_id` and `span_id`
/// fields (see `ferry_runtime::telemetry`).
#[derive(Clone, Debug, Default)]
struct TraceIds {
    trace_id: String,
    span_id: String,
}

impl TraceIds {
    fn complete(&self) -> bool {
        !self.trace_id.is_empty() && !self.span_id.is_empty()
    }
}

impl Visit for TraceIds {
    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "trace_id" => self.trace_id = value.to_owned(),
            "span_id" => self.span_id = value.to_owned(),
            _ => {}
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if matches!(field.name(), "trace_id" | "span_id") {
            self.record_str(field, &format!("{value:?}"));
        }
    }
}

/// Keeps each span's `trace_id` and `span_id` fields, as they are given or recorded later,
/// where the JSON lines of its events find them.
struct TraceIdsLayer;

impl TraceIdsLayer {
    fn keep<S>(span: Option<SpanRef<'_, S>>, record: impl FnOnce(&mut TraceIds))
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
    {
        let Some(span) = span else { return };
        let mut ext = span.extensions_mut();
        match ext.get_mut::<TraceIds>() {
            Some(ids) => record(ids),
            None => {
                let mut ids = TraceIds::default();
                record(&mut ids);
                if !ids.trace_id.is_empty() || !ids.span_id.is_empty() {
                    ext.insert(ids);
                }
            }
        }
    }
}

impl<S> Layer<S> for TraceIdsLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        Self::keep(ctx.span(id), |ids| attrs.record(ids));
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        Self::keep(ctx.span(id), |ids| values.record(ids));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer the test reads back.
    #[derive(Clone, Default)]
    struct Buf(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn json_lines_carry_the_ids_their_spans_record() {
        let buf = Buf::default();
        let w = buf.clone();
        let subscriber = tracing_subscriber::registry().with(TraceIdsLayer).with(json_layer().with_writer(move || w.clone()));
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!("outside");
            let span = tracing::info_span!("task", task_id = "t1", trace_id = tracing::field::Empty, span_id = tracing::field::Empty);
            span.record("trace_id", tracing::field::display("0af7651916cd43dd8448eb211c80319c"));
            span.record("span_id", tracing::field::display("b7ad6b7169203331"));
            span.in_scope(|| tracing::info_span!("inner").in_scope(|| tracing::warn!(n = 1, "inside")));
        });
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"))).collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert_eq!(lines[0]["message"], "outside");
        assert!(lines[0].get("trace_id").is_none(), "{}", lines[0]);
        assert_eq!(lines[1]["message"], "inside");
        assert_eq!(lines[1]["n"], 1);
        assert_eq!(lines[1]["level"], "WARN");
        assert_eq!(lines[1]["trace_id"], "0af7651916cd43dd8448eb211c80319c", "from the enclosing span: {}", lines[1]);
        assert_eq!(lines[1]["span_id"], "b7ad6b7169203331");
        assert_eq!(lines[1]["spans"][0]["task_id"], "t1", "{}", lines[1]);
    }
}
