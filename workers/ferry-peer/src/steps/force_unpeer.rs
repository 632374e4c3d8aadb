//! A force unpeer's steps (`operation: ForceUnpeer`, Liqo only): clean `a`'s side of its
//! peering with `b` when `b` is gone for good, never contacting `b`, as `liqoctl force
//! unpeer` does (liqotech/liqo `pkg/liqoctl/force/unpeer/handler.go`, `RunForceUnpeer`):
//! `a`'s ForeignCluster of `b` is annotated `liqo.io/foreign-cluster-permanently-unreachable:
//! "true"`, then `a`'s tenant namespace for `b` is deleted and awaited
//! (`unauthenticate.DeleteTenantNamespace(..., true)`).
//!
//! The annotation is what lets Liqo on `a` let go: its CRD replicator keeps a local
//! ResourceSlice or NamespaceMap being deleted until the provider's copy has vanished, and
//! counts a provider's copies vanished without asking it only once the ForeignCluster
//! state controller judged it dead (`internal/crdReplicator/reflection/handler.go`,
//! `foreignclusterstate_controller.go`: `foreigncluster.IsDead`, the annotation and no
//! `Established` `APIServerStatus`). Without it the namespace waits forever for a provider
//! that never answers, which is why a plain unpeer ends `RevertFailed` then.
//!
//! Ferry deletes only what is its own for the pair ([`liqo::PEERING_LABEL`]): `b`'s id is
//! read from those objects on `a` (the tenant namespace, or the Liqo objects in a tenant
//! namespace Ferry reused), since `b` cannot be asked. A tenant namespace that is not
//! Ferry's stays; the pair's objects in it are deleted one by one. Once all is gone the
//! ForeignCluster is deleted too (Liqo's controller makes one again for any object that
//! names `b`): left annotated, it would declare a later peering with a cluster of that id
//! dead whenever its API server checker had not reported it `Established`.
//!
//! `check` also waits (within the command's timeout) until Liqo on `a` no longer finds
//! `b`'s API server answering (`APIServerStatus` not `Established`,
//! `core/foreigncluster-controller/apiserverchecker.go`): `IsDead` needs both, so a force
//! unpeer of a provider that still answers would wait on Liqo's finalizers for ever; it
//! fails `PEER_ANSWERS` instead, saying to unpeer.
//!
//! `check` changes nothing; `force-unpeer` cannot be undone (`IRREVERSIBLE` once it began):
//! a peering needs `b`; peer again once it is back. Its failure after the annotation (a
//! removal that does not end within the worker's bound) ends the task Failed, not
//! reverted: the same command again goes on from there.

use std::collections::BTreeSet;

use ferry_kube::Check;
use ferry_kube::step_errors::{api_err, wait_err};
use ferry_kube::vocab::liqo::{REMOTE_ID_LABEL, TENANT_NAMESPACE_LABEL};
use ferry_task::{CheckStep, Output, Step, StepContext, StepError, StepPolicy, codes};
use futures::FutureExt;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::{LiqoConfiguration, LiqoForeignCluster, LiqoGatewayClient, LiqoGatewayServer, LiqoIdentity, LiqoPublicKey, LiqoResourceSlice, LiqoTenant};
use crate::handler::Inner;
use crate::liqo::{self, PEERING_LABEL};
use crate::spec::PeerClusters;

/// The annotation that declares a ForeignCluster's cluster dead (`pkg/consts/annotations.go`,
/// `ForeignClusterPermanentlyUnreachableAnnotationKey`).
pub const PERMANENTLY_UNREACHABLE: &str = "liqo.io/foreign-cluster-permanently-unreachable";

/// The force unpeer's `check` output.
pub const FORCE_CHECK: Output<ForceChecked> = Output::new("check");
/// The `force-unpeer` step's output.
pub const FORCE_UNPEER: Output<ForceUnpeered> = Output::new("force-unpeer");

/// What `check` found of the pair's peering on `a`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForceChecked {
    /// `b`'s Liqo id, read from Ferry's objects for the pair on `a`; none: nothing is left.
    pub remote: Option<String>,
    /// `a`'s tenant namespace for `b` when Ferry made it (deleted whole); none when Ferry
    /// reused one (only the pair's objects in it go).
    pub namespace: Option<String>,
    /// How many of the pair's objects `a` holds (the namespace counted).
    pub objects: usize,
}

/// What `force-unpeer` did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForceUnpeered {
    /// `b`'s id, whose ForeignCluster on `a` was declared dead and then deleted.
    pub remote: Option<String>,
    /// The objects deleted on `a` (kind/namespace/name), the tenant namespace first when
    /// it was Ferry's.
    pub deleted: Vec<String>,
}

/// The Liqo kinds a peering puts on a side, besides its tenant namespace and Secrets.
fn peering_kinds() -> Vec<ApiResource> {
    vec![
        ApiResource::erase::<LiqoResourceSlice>(&()),
        ApiResource::erase::<LiqoIdentity>(&()),
        ApiResource::erase::<LiqoTenant>(&()),
        ApiResource::erase::<LiqoPublicKey>(&()),
        ApiResource::erase::<LiqoGatewayClient>(&()),
        ApiResource::erase::<LiqoGatewayServer>(&()),
        ApiResource::erase::<LiqoConfiguration>(&()),
        ApiResource::erase::<Secret>(&()),
    ]
}

/// A deletion's answer, with "not found" (and any of `also`) counted done: what is gone,
/// or already going, needs no second deletion.
fn gone_ok<T>(answer: Result<T, kube::Error>, also: &[u16]) -> Result<(), kube::Error> {
    match answer {
        Err(kube::Error::Api(e)) if e.code == 404 || also.contains(&e.code) => Ok(()),
        other => other.map(drop),
    }
}

/// Everything a cluster holds labelled for `pair`: its tenant namespaces, then the
/// objects of [`peering_kinds`] (kinds not served skipped).
pub(crate) async fn labelled(client: &kube::Client, pair: &str) -> Result<(Vec<Namespace>, Vec<(ApiResource, DynamicObject)>), kube::Error> {
    let lp = ListParams::default().labels(&format!("{PEERING_LABEL}={pair}"));
    let namespaces = Api::<Namespace>::all(client.clone()).list(&lp).await?.items;
    let mut objects = Vec::new();
    for kind in peering_kinds() {
        match Api::<DynamicObject>::all_with(client.clone(), &kind).list(&lp).await {
            Ok(l) => objects.extend(l.items.into_iter().map(|o| (kind.clone(), o))),
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    Ok((namespaces, objects))
}

/// `check` of a force unpeer: `a` runs Liqo (its controllers do the teardown), and what of
/// the pair's peering it holds. `b` is never contacted.
pub(crate) struct ForceCheck(pub std::sync::Arc<Inner>, pub StepPolicy);

/// Whether a ForeignCluster's `APIServerStatus` condition says its API server answers.
fn api_server_answers(fc: &LiqoForeignCluster) -> bool {
    fc.status_at("/conditions").and_then(Value::as_array).is_some_and(|cs| cs.iter().any(|c| c["type"] == "APIServerStatus" && c["status"] == "Established"))
}

impl ForceCheck {
    /// Waits, within the command's timeout, until Liqo on `a` no longer finds `b`'s API
    /// server answering: `foreigncluster.IsDead` needs the annotation *and* no
    /// `Established` `APIServerStatus` (its checker pings every 15 s by default,
    /// `apiserverchecker.go`), so a force unpeer of a provider that answers would wait on
    /// Liqo's finalizers for ever. A ForeignCluster without the condition (no API server
    /// checker) or none at all does not hold it up.
    async fn provider_silent(&self, cx: &StepContext<'_, PeerClusters>, client: &kube::Client, remote: &str) -> Result<(), StepError> {
        let p = cx.spec;
        let current = Api::<LiqoForeignCluster>::all(client.clone()).get_opt(remote).await.map_err(api_err(&p.a))?;
        if !current.as_ref().is_some_and(api_server_answers) {
            return Ok(());
        }
        cx.progress(50, format!("Liqo on {} still finds {}'s API server answering (ForeignCluster {remote}, APIServerStatus Established): waiting until its checker finds it down", p.a, p.b));
        let why = format!(
            "ForeignCluster {remote} on {} says {}'s API server answers (APIServerStatus Established), so Liqo would not count it dead; if {} is up, unpeer the pair instead",
            p.a, p.b, p.b
        );
        self.0
            .cfg
            .watches
            .wait_object::<LiqoForeignCluster, ()>(&p.a, client, None, remote, p.timeout(), |fc| match fc {
                Some(fc) if api_server_answers(fc) => Check::Pending(why.clone()),
                _ => Check::Done(()),
            })
            .await
            .map_err(|e| wait_err(codes::PEER_ANSWERS, e))
    }
}

impl CheckStep<PeerClusters> for ForceCheck {
    fn name(&self) -> &str {
        FORCE_CHECK.step()
    }

    fn policy(&self) -> StepPolicy {
        self.1.clone()
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, PeerClusters>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let p = cx.spec;
            self.0.liqo_ready(&p.a, p.timeout()).await?;
            let client = self.0.client(&p.a).await?;
            let pair = liqo::pair_label(&p.a, &p.b);
            let (namespaces, objects) = labelled(&client, &pair).await.map_err(api_err(&p.a))?;
            let remote_of = |labels: Option<&std::collections::BTreeMap<String, String>>| labels.and_then(|l| l.get(REMOTE_ID_LABEL)).cloned();
            let mut remotes: BTreeSet<String> =
                namespaces.iter().filter_map(|n| remote_of(n.metadata.labels.as_ref())).chain(objects.iter().filter_map(|(_, o)| remote_of(o.metadata.labels.as_ref()))).collect();
            // A ForeignCluster an earlier force unpeer of the pair declared dead, then failed
            // to see gone ([`ForceUnpeer::declare_dead`] labels it).
            let declared = Api::<LiqoForeignCluster>::all(client.clone()).list(&ListParams::default().labels(&format!("{PEERING_LABEL}={pair}"))).await;
            match declared {
                Ok(l) => remotes.extend(l.items.iter().filter_map(|fc| fc.spec.get("clusterID")?.as_str().map(str::to_owned))),
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(api_err(&p.a)(e)),
            }
            if remotes.len() > 1 {
                return Err(StepError::permanent(
                    codes::OBJECT_NOT_FERRYS,
                    format!("{}'s objects labelled {PEERING_LABEL}={pair} name more than one remote cluster ({}): not one peering; nothing was changed", p.a, remotes.into_iter().collect::<Vec<_>>().join(", ")),
                ));
            }
            let namespace = namespaces
                .iter()
                .find(|n| n.metadata.labels.as_ref().is_some_and(|l| l.get(TENANT_NAMESPACE_LABEL).is_some_and(|v| v == "true")))
                .and_then(|n| n.metadata.name.clone());
            let found = ForceChecked { remote: remotes.into_iter().next(), namespace, objects: namespaces.len() + objects.len() };
            if let Some(remote) = &found.remote {
                self.provider_silent(cx, &client, remote).await?;
            }
            match &found.remote {
                Some(r) => cx.progress(100, format!("{} holds {} objects of its peering with {} (Liqo id {r}); {} is not contacted", p.a, found.objects, p.b, p.b)),
                None => cx.progress(100, format!("{} holds nothing of a Ferry peering with {}", p.a, p.b)),
            }
            FORCE_CHECK.value(&found)
        }
        .boxed()
    }
}

/// `force-unpeer`: `a`'s ForeignCluster of `b` declared dead, the pair's objects on `a`
/// deleted and awaited, then the ForeignCluster deleted.
pub(crate) struct ForceUnpeer(pub std::sync::Arc<Inner>, pub StepPolicy);

impl ForceUnpeer {
    /// Annotates `cluster`'s ForeignCluster of `remote`, labelled for `pair` so that the
    /// same command sent again after a failure finds `remote` there once the pair's other
    /// objects are gone; false when it has none.
    async fn declare_dead(&self, cluster: &str, remote: &str, pair: &str) -> Result<bool, StepError> {
        let api: Api<LiqoForeignCluster> = Api::all(self.0.client(cluster).await?);
        let patch = json!({"metadata": {"annotations": {PERMANENTLY_UNREACHABLE: "true"}, "labels": {PEERING_LABEL: pair}}});
        match api.patch(remote, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(false),
            Err(e) => Err(api_err(cluster)(e)),
        }
    }

    /// Waits until none of the pair's `K` is left in `ns` on `cluster`.
    async fn none_of<K>(&self, cluster: &str, client: &kube::Client, ns: &str, pair: &str) -> Result<(), StepError>
    where
        K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    {
        let what = format!("the peering's {} in {ns}", K::kind(&()));
        self.0
            .cfg
            .watches
            .wait_store::<K, ()>(cluster, client, Some(ns), &what, self.0.cfg.removal_timeout, |s| {
                let left: Vec<String> = s.state().iter().filter(|o| o.meta().labels.as_ref().and_then(|l| l.get(PEERING_LABEL)).is_some_and(|v| v == pair)).map(|o| o.meta().name.clone().unwrap_or_default()).collect();
                if left.is_empty() { Check::Done(()) } else { Check::Pending(format!("left: {}", left.join(", "))) }
            })
            .await
            .map_err(|e| wait_err(codes::REMOVAL, e))
    }
}

impl Step<PeerClusters> for ForceUnpeer {
    fn name(&self) -> &str {
        FORCE_UNPEER.step()
    }

    fn policy(&self) -> StepPolicy {
        self.1.clone()
    }

    fn run<'a>(&'a self, cx: &'a StepContext<'a, PeerClusters>) -> BoxFuture<'a, Result<Value, StepError>> {
        async move {
            let p = cx.spec;
            let found: ForceChecked = cx.required(FORCE_CHECK.step())?;
            let Some(remote) = found.remote else { return FORCE_UNPEER.value(&ForceUnpeered::default()) };
            let (a, pair) = (&p.a, liqo::pair_label(&p.a, &p.b));
            if self.declare_dead(a, &remote, &pair).await? {
                cx.progress(10, format!("ForeignCluster {remote} on {a} declared permanently unreachable ({PERMANENTLY_UNREACHABLE}): Liqo there stops waiting for {}", p.b));
            } else {
                cx.progress(10, format!("{a} has no ForeignCluster {remote}: nothing to declare unreachable"));
            }
            // From here on nothing can be put back: a failure ends the task Failed (not
            // reverted); the same command again goes on from where this one stopped.
            let keep = |e: StepError| if e.transient { e } else { e.keeping_done() };
            let client = self.0.client(a).await?;
            let (_, objects) = labelled(&client, &pair).await.map_err(api_err(a))?;
            let mut deleted = Vec::new();
            if let Some(ns) = &found.namespace {
                // Gone, or terminating already (the API server answers 409 then).
                gone_ok(Api::<Namespace>::all(client.clone()).delete(ns, &Default::default()).await, &[409]).map_err(api_err(a))?;
                deleted.push(format!("Namespace/{ns}"));
            }
            // The pair's objects outside a namespace being deleted (in a tenant namespace
            // Ferry reused), one by one.
            let mut reused = BTreeSet::new();
            for (kind, o) in objects.iter().filter(|(_, o)| o.metadata.namespace != found.namespace) {
                let (ns, name) = (o.metadata.namespace.clone().unwrap_or_default(), o.metadata.name.clone().unwrap_or_default());
                gone_ok(Api::<DynamicObject>::namespaced_with(client.clone(), &ns, kind).delete(&name, &Default::default()).await, &[]).map_err(api_err(a))?;
                deleted.push(format!("{}/{ns}/{name}", kind.kind));
                reused.insert(ns);
            }
            if deleted.is_empty() {
                cx.progress(30, format!("nothing of the peering is left on {a} but its ForeignCluster {remote}"));
            } else {
                cx.progress(30, format!("deleting {} on {a}; waiting until Liqo there has let go", deleted.join(", ")));
            }
            if let Some(ns) = &found.namespace {
                self.0.cfg.watches.wait_namespace_deleted(a, &client, ns, self.0.cfg.removal_timeout).await.map_err(|e| keep(wait_err(codes::REMOVAL, e)))?;
            }
            for ns in &reused {
                self.none_of::<LiqoResourceSlice>(a, &client, ns, &pair).await.map_err(keep)?;
                self.none_of::<LiqoIdentity>(a, &client, ns, &pair).await.map_err(keep)?;
                self.none_of::<LiqoTenant>(a, &client, ns, &pair).await.map_err(keep)?;
                self.none_of::<LiqoGatewayClient>(a, &client, ns, &pair).await.map_err(keep)?;
                self.none_of::<LiqoGatewayServer>(a, &client, ns, &pair).await.map_err(keep)?;
                self.none_of::<LiqoConfiguration>(a, &client, ns, &pair).await.map_err(keep)?;
            }
            self.0.forget_foreign_cluster(a, &remote).await.map_err(keep)?;
            cx.progress(100, format!("{a} holds nothing of its peering with {} any more; ForeignCluster {remote} deleted", p.b));
            FORCE_UNPEER.value(&ForceUnpeered { remote: Some(remote), deleted })
        }
        .boxed()
    }

    /// Nothing to put back before the ForeignCluster was declared dead; after that, a
    /// peering cannot be made without `b`.
    fn undo<'a>(&'a self, cx: &'a StepContext<'a, PeerClusters>, out: Option<&'a Value>) -> BoxFuture<'a, Result<(), StepError>> {
        async move {
            let p = cx.spec;
            let done = out.and_then(|o| serde_json::from_value::<ForceUnpeered>(o.clone()).ok());
            let began = match (done, cx.output_of::<ForceChecked>(FORCE_CHECK.step()).and_then(|f| f.remote)) {
                (Some(d), _) => d.remote.is_some(),
                (None, None) => false,
                (None, Some(remote)) => {
                    let api: Api<LiqoForeignCluster> = Api::all(self.0.client(&p.a).await?);
                    match api.get_opt(&remote).await {
                        Ok(fc) => fc.is_none_or(|fc| fc.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(PERMANENTLY_UNREACHABLE))),
                        Err(e) => return Err(api_err(&p.a)(e)),
                    }
                }
            };
            if began {
                return Err(StepError::permanent(
                    codes::IRREVERSIBLE,
                    format!("a force unpeer cannot be undone: {}'s side of the peering with {} is removed; peer the pair again once {} is back", p.a, p.b, p.b),
                ));
            }
            Ok(())
        }
        .boxed()
    }
}
