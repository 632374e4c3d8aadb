//! What a command would act on (clusters, cluster sets, namespaces), as its kind reads it
//! from the spec: the runtime checks it against the sending tenant's policy before the
//! task is accepted, and again whenever a stored task is resumed.

/// The targets of one command.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Targets {
    /// Clusters named by the command (never `hub`: `validate` refuses it).
    pub clusters: Vec<String>,
    /// OCM ManagedClusterSets the command places into.
    pub cluster_sets: Vec<String>,
    /// Namespaces it writes (on the hub or on its clusters).
    pub namespaces: Vec<String>,
    /// Set when the command chooses some of its clusters only when it runs (a label
    /// selector): says what chooses them. A policy that lists its clusters refuses it.
    pub chosen_at_run: Option<String>,
}

impl Targets {
    /// Targets with these clusters.
    pub fn clusters<I: IntoIterator<Item = S>, S: Into<String>>(clusters: I) -> Self {
        Self { clusters: clusters.into_iter().map(Into::into).collect(), ..Self::default() }
    }

    /// Adds cluster sets.
    #[must_use]
    pub fn with_sets<I: IntoIterator<Item = S>, S: Into<String>>(mut self, sets: I) -> Self {
        self.cluster_sets.extend(sets.into_iter().map(Into::into));
        self
    }

    /// Adds namespaces.
    #[must_use]
    pub fn with_namespaces<I: IntoIterator<Item = S>, S: Into<String>>(mut self, namespaces: I) -> Self {
        self.namespaces.extend(namespaces.into_iter().map(Into::into));
        self
    }

    /// Marks clusters chosen at run time by `what`.
    #[must_use]
    pub fn chosen_at_run(mut self, what: impl Into<String>) -> Self {
        self.chosen_at_run = Some(what.into());
        self
    }
}
