//! The two shapes peer steps share. An [`ObjectSet`] names objects to apply, how to see
//! them take effect and how to see them gone; [`Applies`] makes it a step.
//! [`Inverse`] turns any step around (unpeer is peer inverted).
//!
//! # Guarantees
//! `Applies::run` applies every object in order (server-side, so a rerun converges) and
//! then waits with [`ObjectSet::ready`]; its undo deletes them in reverse order, but only
//! those labelled for this pair ([`crate::liqo::PEERING_LABEL`]), then waits with
//! [`ObjectSet::gone`]. The applies are forced and label what they write, so what keeps
//! another peering's or a person's objects untouched is `check`
//! ([`super::liqo_check`]): it leaves a tenant namespace that was there and is not Ferry's
//! out of `prepare`'s set, and refuses a peer over any other Liqo object that is not.
//!
//! # Assumptions
//! `objects` is pure: the same spec and ids give the same objects, so an undo after a
//! crash deletes what the run applied.

use std::sync::Arc;

use ferry_task::{Step, StepContext, StepError, StepPolicy};
use futures::FutureExt;
use futures::future::BoxFuture;
use serde_json::{Value, json};

use super::liqo_check::IDS;
use crate::handler::Inner;
use crate::liqo;
use crate::spec::PeerClusters;

use super::liqo_check::Ids;

/// Where an undo's wait says what holds it: a StepProgress message.
pub(crate) type Progress<'a> = &'a (dyn Fn(String) + Send + Sync);

/// Objects a step applies, with the waits that follow applying and deleting them.
pub(crate) trait ObjectSet: Send + Sync {
    /// The step's name.
    fn name(&self) -> &'static str;

    /// `(cluster, object)` pairs, in apply order. Liqo sets read the clusters' ids;
    /// Submariner's get default ids and ignore them.
    fn objects(&self, p: &PeerClusters, ids: &Ids) -> Vec<(String, Value)>;

    /// Waits until the applied objects took effect; the step's output.
    fn ready<'a>(&'a self, _inner: &'a Inner, _p: &'a PeerClusters, _ids: &'a Ids) -> BoxFuture<'a, Result<Value, StepError>> {
        async { Ok(json!({})) }.boxed()
    }

    /// Waits until what the objects made is gone, saying through `progress` what holds a
    /// long wait.
    fn gone<'a>(&'a self, _inner: &'a Inner, _p: &'a PeerClusters, _ids: &'a Ids, _progress: Progress<'a>) -> BoxFuture<'a, Result<(), StepError>> {
        async { Ok(()) }.boxed()
    }
}

/// The step of an [`ObjectSet`].
pub(crate) struct Applies<T> {
    inner: Arc<Inner>,
    set: T,
    policy: StepPolicy,
}

impl<T> Applies<T> {
    pub(crate) fn new(inner: &Arc<Inner>, set: T, policy: StepPolicy) -> Self {
        Self { inner: inner.clone(), set, policy }
    }
}

impl<T: ObjectSet> Step<PeerClusters> for Applies<T> {
    fn name(&self) -> &str {
        self.set.name()
    }

    fn policy(&self) -> StepPolicy {
        self.policy.clone()
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, PeerClusters>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let ids = IDS.get(cx).unwrap_or_default();
            let objs = self.set.objects(cx.spec, &ids);
            for (i, (cluster, o)) in objs.iter().enumerate() {
                self.inner.apply(cluster, o).await?;
                cx.progress(
                    (50 * (i + 1) / objs.len().max(1)) as u8,
                    format!("{} {} on {cluster}", o["kind"].as_str().unwrap_or("?"), o["metadata"]["name"].as_str().unwrap_or("?")),
                );
            }
            let out = self.set.ready(&self.inner, cx.spec, &ids).await?;
            cx.progress(100, format!("{} done", self.set.name()));
            Ok(out)
        }
        .boxed()
    }

    fn undo<'a>(&'a self, cx: &'a StepContext<'a, PeerClusters>, _: Option<&'a Value>) -> BoxFuture<'a, Result<(), StepError>> {
        async move {
            let ids = IDS.get(cx).unwrap_or_default();
            let pair = liqo::pair_label(&cx.spec.a, &cx.spec.b);
            for (cluster, o) in self.set.objects(cx.spec, &ids).iter().rev() {
                self.inner.delete_own(cluster, o, &pair).await?;
            }
            let report = |message: String| cx.progress(90, message);
            self.set.gone(&self.inner, cx.spec, &ids, &report).await?;
            cx.progress(100, format!("{} removed", self.set.name()));
            Ok(())
        }
        .boxed()
    }
}

/// A Liqo step of a task that owns its peering. When `check` found the pair already peered
/// by an earlier Ferry task ([`Ids::reused`]) the peering is that task's: the run applies
/// nothing (its output says `reused`) and the undo removes nothing, so a revert of the
/// second peer of a pair leaves the first's peering up.
pub(crate) struct UnlessReused(pub(crate) Arc<dyn Step<PeerClusters>>);

impl Step<PeerClusters> for UnlessReused {
    fn name(&self) -> &str {
        self.0.name()
    }

    fn policy(&self) -> StepPolicy {
        self.0.policy()
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, PeerClusters>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            if IDS.get(cx).is_some_and(|ids| ids.reused) {
                cx.progress(100, "the pair's peering is an earlier Ferry task's: nothing applied");
                return Ok(json!({"reused": true}));
            }
            self.0.run(cx).await
        }
        .boxed()
    }

    fn undo<'a>(&'a self, cx: &'a StepContext<'a, PeerClusters>, out: Option<&'a Value>) -> BoxFuture<'a, Result<(), StepError>> {
        async move {
            if IDS.get(cx).is_some_and(|ids| ids.reused) {
                cx.progress(100, "the pair's peering is an earlier Ferry task's: nothing removed");
                return Ok(());
            }
            self.0.undo(cx, out).await
        }
        .boxed()
    }
}

/// Runs a step's undo as its run and its run as its undo, named `remove-<step>`: unpeer
/// is peer inverted. Its output is empty.
pub(crate) struct Inverse {
    step: Arc<dyn Step<PeerClusters>>,
    name: String,
}

impl Inverse {
    pub(crate) fn new(step: Arc<dyn Step<PeerClusters>>) -> Self {
        let name = format!("remove-{}", step.name());
        Self { step, name }
    }
}

impl Step<PeerClusters> for Inverse {
    fn name(&self) -> &str {
        &self.name
    }

    fn policy(&self) -> StepPolicy {
        self.step.policy()
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, PeerClusters>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            self.step.undo(cx, None).await?;
            Ok(json!({}))
        }
        .boxed()
    }

    fn undo<'a>(&'a self, cx: &'a StepContext<'a, PeerClusters>, _: Option<&'a Value>) -> BoxFuture<'a, Result<(), StepError>> {
        async move { self.step.run(cx).await.map(drop) }.boxed()
    }
}
