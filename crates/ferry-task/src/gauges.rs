//! Gauges a task handler reports beside the runtime's own metrics, read at each scrape of
//! the worker's `/metrics` (e.g. how many of a cluster's watches are failing).

/// The labels of one sample: (label name, value) pairs.
pub type Labels = Vec<(&'static str, String)>;

/// One gauge family: its name (without the runtime's `ferry_` prefix), its help, and its
/// samples now. A family without samples is still exported (its `# TYPE` line), so alert
/// rules and dashboards can name it before anything is measured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GaugeFamily {
    /// Name without the `ferry_` prefix, e.g. `cluster_watches_failing`.
    pub name: &'static str,
    /// The `# HELP` text.
    pub help: &'static str,
    /// One value per label set.
    pub samples: Vec<(Labels, i64)>,
}
