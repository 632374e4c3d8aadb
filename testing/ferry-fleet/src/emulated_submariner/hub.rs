//! The submariner-addon's hub side, each part after its upstream file: the install (the
//! Broker CRD, the ClusterManagementAddOn), the broker controller
//! (`pkg/hub/submarinerbroker/controller.go`), the agent controller
//! (`pkg/hub/submarineragent/controller.go`) and the add-on framework's deployment of the
//! add-on's own agent (`pkg/hub/submarineraddonagent/agent.go` through addon-framework).

use std::time::Duration;

use base64::Engine;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::applied_cache::AppliedCache;
use crate::emulate::finalizer_patch;

use super::{ADDON, BROKER, Error, addons, ar, cond, delete, managed_clusters, name_of, own_crd, set_addon_conditions, ssa, works};

pub use ferry_kube::vocab::ocm::CLUSTERSET_LABEL;

/// The agent controller's finalizer on a ManagedClusterAddOn (`pkg/constants/constants.go`, `SubmarinerAddOnFinalizer`).
pub const ADDON_FINALIZER: &str = "submarineraddon.open-cluster-management.io/submariner-addon-cleanup";
/// The broker controller's finalizer on a ManagedClusterSet (`submarinerbroker/controller.go`, `brokerFinalizer`).
pub const SET_FINALIZER: &str = "cluster.open-cluster-management.io/submariner-cleanup";
/// The annotation naming a set's broker namespace (`SubmBrokerNamespaceKey`).
pub const BROKER_NS_ANNOTATION: &str = "cluster.open-cluster-management.io/submariner-broker-ns";
/// The label of a broker namespace (`manifests/broker-namespace.yaml`).
pub const BROKER_NS_LABEL: &str = "submariner.io/broker";
/// The ManifestWork with the operator's namespace, OperatorGroup and OLM Subscription (`OperatorManifestWorkName`).
pub const OPERATOR_WORK: &str = "submariner-operator";
/// The ManifestWork with the Secrets and the Submariner CR (`SubmarinerCRManifestWorkName`).
pub const RESOURCE_WORK: &str = "submariner-resource";
/// The add-on framework's ManifestWork deploying the add-on's agent
/// (addon-framework `pkg/addonmanager/constants/constants.go`, `DeployWorkNamePrefix` + index).
pub const DEPLOY_WORK: &str = "addon-submariner-deploy-0";
/// Where the agent installs without an install namespace (addon-framework `addonfactory.AddonDefaultInstallNamespace`).
pub const DEFAULT_INSTALL_NAMESPACE: &str = "open-cluster-management-agent-addon";
/// The v1beta1 annotation that carries v1alpha1's `spec.installNamespace`
/// (open-cluster-management-io/api `addon/v1beta1`, `InstallNamespaceAnnotation`).
pub const INSTALL_NAMESPACE_ANNOTATION: &str = "addon.open-cluster-management.io/v1alpha1-install-namespace";
/// The IPsec pre-shared key the broker controller makes per broker namespace (`constants.IPSecPSKSecretName`).
pub const PSK_SECRET: &str = "submariner-ipsec-psk";
/// The globalnet ConfigMap the agent controller makes from the Broker (submariner-operator `pkg/discovery/globalnet`).
pub const GLOBALNET_CONFIGMAP: &str = "submariner-globalnet-info";
/// The backup label the agent controller puts on the Broker and the ConfigMap (`BackupLabelKey`).
pub const BACKUP_LABEL: &str = "cluster.open-cluster-management.io/backup";
/// How long the cleanup waits for the resource ManifestWork to go (`ManifestWorkDeletionTimeout`).
const WORK_DELETION_TIMEOUT: i64 = 120;
/// How long an unchanged apply is skipped (upstream's resource cache, with a resync), and
/// the longest the emulated add-on goes without a pass.
pub(super) const RESYNC: Duration = Duration::from_secs(10);

pub(super) fn sets() -> kube::api::ApiResource {
    ar("cluster.open-cluster-management.io", "v1beta2", "ManagedClusterSet", "managedclustersets")
}

/// The Broker kind (`BrokerGVR`: `submariner.io/v1alpha1` `brokers`).
pub fn brokers() -> kube::api::ApiResource {
    ar("submariner.io", "v1alpha1", "Broker", "brokers")
}

pub(super) fn configs() -> kube::api::ApiResource {
    ar("submarineraddon.open-cluster-management.io", "v1alpha1", "SubmarinerConfig", "submarinerconfigs")
}

pub(super) fn cluster_management_addons() -> kube::api::ApiResource {
    ar("addon.open-cluster-management.io", "v1alpha1", "ClusterManagementAddOn", "clustermanagementaddons")
}

fn core(kind: &str, plural: &str) -> kube::api::ApiResource {
    ar("", "v1", kind, plural)
}

fn rbac(kind: &str, plural: &str) -> kube::api::ApiResource {
    ar("rbac.authorization.k8s.io", "v1", kind, plural)
}

/// The broker namespace of set `name`, as `submarinerbrokerinfo/brokerinfo.go`
/// `GenerateBrokerName` makes it: `<name>-broker`, or, past 63 characters, the name
/// without its first five characters.
pub fn broker_namespace(name: &str) -> String {
    let n = format!("{name}-broker");
    if n.len() > 63 { format!("{}-broker", name.get(5..).unwrap_or(name)) } else { n }
}

/// Where the add-on installs on `cluster` (`controller.go` `deploySubmarinerAgent`: the
/// install-namespace annotation, else the framework's default; in v1alpha1, as stored
/// here, that annotation is `spec.installNamespace`).
pub fn install_namespace(addon: &DynamicObject) -> String {
    addon
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(INSTALL_NAMESPACE_ANNOTATION))
        .cloned()
        .or_else(|| addon.data.pointer("/spec/installNamespace").and_then(Value::as_str).filter(|s| !s.is_empty()).map(str::to_owned))
        .unwrap_or_else(|| DEFAULT_INSTALL_NAMESPACE.to_owned())
}

/// Installs the add-on on the hub: the Broker CRD (upstream's `submarinerbroker/brokerCRDsController.go`
/// installs the Submariner operator's; ../shared/crds has none, so it is one of our own
/// making) and the `submariner` ClusterManagementAddOn
/// (`deploy/olm-catalog/manifests/submarineraddon.cluster-management-addon.yaml`).
pub async fn install(hub: &kube::Client) -> Result<(), Error> {
    crate::crds::install(hub, vec![own_crd("submariner.io", "v1alpha1", "Broker", "brokers", true)]).await?;
    let obj = json!({"apiVersion": "addon.open-cluster-management.io/v1alpha1", "kind": "ClusterManagementAddOn", "metadata": {"name": ADDON},
        "spec": {"addOnMeta": {"displayName": "Submariner Addon", "description": "Submariner Addon for MultiCluster connectivity"}}});
    ssa(hub, &cluster_management_addons(), &obj).await?;
    Ok(())
}

/// What the hub part remembers between passes: upstream's resource cache.
pub struct Hub {
    applied: AppliedCache,
}

impl Default for Hub {
    fn default() -> Self {
        Self { applied: AppliedCache::new(Some(RESYNC)) }
    }
}

impl std::fmt::Debug for Hub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hub").finish_non_exhaustive()
    }
}

/// The resource cache's key of object `name` of kind `plural` in `namespace` ("" when
/// cluster-scoped): `plural/namespace/name`, which [`Hub::forget`] reads back.
fn cache_key(plural: &str, namespace: &str, name: &str) -> String {
    format!("{plural}/{namespace}/{name}")
}

impl Hub {
    /// Applies `obj` unless this very content was applied within [`RESYNC`] and nothing
    /// forgot it since.
    async fn apply(&self, hub: &kube::Client, ar: &kube::api::ApiResource, obj: &Value) -> Result<(), Error> {
        let key = cache_key(&ar.plural, obj.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or(""), obj["metadata"]["name"].as_str().unwrap_or(""));
        self.applied.apply(key, obj.to_string(), async { ssa(hub, ar, obj).await.map(drop) }).await?;
        Ok(())
    }

    /// Forgets the ManifestWork `meta` names (deleted: by the add-on's owner reference
    /// too, which no pass of ours sees), or every work when None, so that a work gone is
    /// applied again on the next pass, as upstream's applier finds it missing from its
    /// informer's cache.
    pub(super) fn forget_work(&self, meta: Option<&kube::api::ObjectMeta>) {
        let plural = works().plural;
        match meta {
            Some(m) => {
                let key = cache_key(&plural, m.namespace.as_deref().unwrap_or(""), m.name.as_deref().unwrap_or(""));
                self.applied.forget(|k| k == key);
            }
            None => self.applied.forget(|k| k.starts_with(&format!("{plural}/"))),
        }
    }

    /// Forgets what was applied in `namespace` (and the namespace itself): gone objects
    /// are applied again at once.
    fn forget(&self, namespace: &str) {
        self.applied.forget(|k| {
            let parts: Vec<&str> = k.split('/').collect();
            parts.get(1) == Some(&namespace) || (parts.first() == Some(&"namespaces") && parts.get(2) == Some(&namespace))
        });
    }

    /// One pass of every hub controller. Nothing happens while the
    /// ClusterManagementAddOn is gone (the add-on uninstalled).
    pub async fn tick(&self, hub: &kube::Client, hub_server: &str) -> Result<(), Error> {
        let cma: Api<DynamicObject> = Api::all_with(hub.clone(), &cluster_management_addons());
        if cma.get_opt(ADDON).await?.is_none() {
            return Ok(());
        }
        let set_api: Api<DynamicObject> = Api::all_with(hub.clone(), &sets());
        for s in set_api.list(&ListParams::default()).await?.items {
            let name = name_of(&s);
            if let Err(e) = self.broker(hub, &set_api, s).await {
                tracing::debug!(set = %name, error = %e, "emulated Submariner broker controller: retrying");
            }
        }
        let mca: Api<DynamicObject> = Api::all_with(hub.clone(), &addons());
        for a in mca.list(&ListParams::default()).await?.items {
            if name_of(&a) != ADDON {
                continue;
            }
            let cluster = a.metadata.namespace.clone().unwrap_or_default();
            if let Err(e) = self.agent(hub, hub_server, a).await {
                tracing::debug!(cluster = %cluster, error = %e, "emulated Submariner agent controller: retrying");
            }
        }
        Ok(())
    }

    /// `submarinerbroker/controller.go` `reconcileManagedClusterSet`: sets of the
    /// `ExclusiveClusterSetLabel` type get the finalizer and the broker-namespace
    /// annotation first, then the namespace, the broker Role
    /// (`manifests/broker-{namespace,cluster-role}.yaml`) and the IPsec PSK Secret; a
    /// deleted set loses its namespace and Role (`doClusterSetCleanup`), then the finalizer.
    async fn broker(&self, hub: &kube::Client, api: &Api<DynamicObject>, set: DynamicObject) -> Result<(), Error> {
        let name = name_of(&set);
        let selector = set.data.pointer("/spec/clusterSelector/selectorType").and_then(Value::as_str).unwrap_or("");
        if !selector.is_empty() && selector != "ExclusiveClusterSetLabel" {
            return Ok(());
        }
        let ns = broker_namespace(&name);
        let finalizers = set.metadata.finalizers.clone().unwrap_or_default();
        let annotated = set.metadata.annotations.as_ref().and_then(|a| a.get(BROKER_NS_ANNOTATION)).cloned().unwrap_or_default();
        if set.metadata.deletion_timestamp.is_some() {
            // Without the annotation upstream returns before removing its finalizer.
            if !finalizers.iter().any(|f| f == SET_FINALIZER) || annotated.is_empty() {
                return Ok(());
            }
            delete(&Api::namespaced_with(hub.clone(), &annotated, &rbac("Role", "roles")), "submariner-k8s-broker-cluster").await?;
            delete(&Api::all_with(hub.clone(), &core("Namespace", "namespaces")), &annotated).await?;
            self.forget(&annotated);
            if let Some(patch) = finalizer_patch(&set.metadata, SET_FINALIZER, false) {
                api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
            }
            return Ok(());
        }
        if !finalizers.iter().any(|f| f == SET_FINALIZER) || annotated != ns {
            let mut all = finalizers.clone();
            if !all.iter().any(|f| f == SET_FINALIZER) {
                all.push(SET_FINALIZER.to_owned());
            }
            let patch = json!({"metadata": {"finalizers": all, "annotations": {BROKER_NS_ANNOTATION: ns}, "resourceVersion": set.metadata.resource_version}});
            api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
            return Ok(());
        }
        self.apply(hub, &core("Namespace", "namespaces"), &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": {BROKER_NS_LABEL: "true"}}}))
            .await?;
        let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "submariner-k8s-broker-cluster", "namespace": ns}, "rules": [
            {"apiGroups": ["submariner.io"], "resources": ["clusters", "endpoints"], "verbs": ["create", "get", "list", "watch", "patch", "update", "delete"]},
            {"apiGroups": ["multicluster.x-k8s.io"], "resources": ["serviceimports"], "verbs": ["create", "get", "list", "watch", "patch", "update", "delete"]},
            {"apiGroups": ["multicluster.x-k8s.io"], "resources": ["serviceimports/status"], "verbs": ["get", "patch", "update"]},
            {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices", "endpointslices/restricted"], "verbs": ["create", "get", "list", "watch", "patch", "update", "delete"]},
            {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list", "watch", "create", "update", "delete"]},
        ]});
        self.apply(hub, &rbac("Role", "roles"), &role).await?;
        // `createIPSecPSKSecret`: 48 random bytes, made once.
        let secrets: Api<DynamicObject> = Api::namespaced_with(hub.clone(), &ns, &core("Secret", "secrets"));
        if secrets.get_opt(PSK_SECRET).await?.is_none() {
            let mut psk = [0u8; 48];
            ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut psk).map_err(|_| Error::Random)?;
            let obj: DynamicObject = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": PSK_SECRET, "namespace": ns},
                "data": {"psk": base64::engine::general_purpose::STANDARD.encode(psk)}}))
            .map_err(Error::Object)?;
            crate::emulate::present(secrets.create(&PostParams::default(), &obj).await)?;
        }
        Ok(())
    }

    /// `submarineragent/controller.go` `syncManagedCluster` for one `submariner`
    /// ManagedClusterAddOn; also the add-on framework's deployment of the agent.
    async fn agent(&self, hub: &kube::Client, hub_server: &str, addon: DynamicObject) -> Result<(), Error> {
        let cluster = addon.metadata.namespace.clone().unwrap_or_default();
        let mc = Api::<DynamicObject>::all_with(hub.clone(), &managed_clusters()).get_opt(&cluster).await?;
        let set = mc.as_ref().and_then(|m| m.metadata.labels.as_ref()).and_then(|l| l.get(CLUSTERSET_LABEL)).cloned().unwrap_or_default();
        if addon.metadata.deletion_timestamp.is_some() {
            // addon-framework: the agent's ManifestWork goes with its add-on (owner reference).
            delete(&Api::namespaced_with(hub.clone(), &cluster, &works()), DEPLOY_WORK).await?;
            return self.cleanup(hub, &cluster, &set).await;
        }
        let Some(mc) = mc else { return Ok(()) };
        self.deploy_agent(hub, &addon).await?;
        // Submariner only goes on clusters of one exclusive set; without one (or with the
        // set gone) whatever was deployed is cleaned up.
        if set.is_empty() || Api::<DynamicObject>::all_with(hub.clone(), &sets()).get_opt(&set).await?.is_none() {
            return self.cleanup(hub, &cluster, "").await;
        }
        if let Some(patch) = finalizer_patch(&addon.metadata, ADDON_FINALIZER, true) {
            Api::<DynamicObject>::namespaced_with(hub.clone(), &cluster, &addons()).patch(ADDON, &PatchParams::default(), &Patch::Merge(&patch)).await?;
            return Ok(());
        }
        self.deploy(hub, hub_server, &cluster, &set, &addon, &mc).await
    }

    /// The add-on framework's agent deployment (`submarineraddonagent/agent.go` with
    /// `manifests/spoke/{serviceaccount,deployment}.yaml`): a ManifestWork
    /// `addon-submariner-deploy-0` with the agent's namespace (kept on uninstall when it is
    /// not the framework's default), ServiceAccount and Deployment, owned by the add-on.
    async fn deploy_agent(&self, hub: &kube::Client, addon: &DynamicObject) -> Result<(), Error> {
        let cluster = addon.metadata.namespace.clone().unwrap_or_default();
        let ns = install_namespace(addon);
        let mut manifests = vec![
            json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "submariner-addon-sa", "namespace": ns}}),
            json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "submariner-addon", "namespace": ns, "labels": {"app": "submariner-addon"}},
                "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "submariner-addon"}},
                    "template": {"metadata": {"labels": {"app": "submariner-addon"}},
                        "spec": {"serviceAccountName": "submariner-addon-sa", "containers": [{"name": "submariner-addon", "image": "quay.io/stolostron/submariner-addon:latest",
                            "args": ["/submariner", "agent", format!("--cluster-name={cluster}"), "--hub-kubeconfig=/var/run/hub/kubeconfig"]}]}}}}),
        ];
        if ns != DEFAULT_INSTALL_NAMESPACE {
            manifests.insert(0, json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "annotations": {"addon.open-cluster-management.io/deletion-orphan": "true"}}}));
        }
        let work = json!({"apiVersion": "work.open-cluster-management.io/v1", "kind": "ManifestWork",
            "metadata": {"name": DEPLOY_WORK, "namespace": cluster, "labels": {"open-cluster-management.io/addon-name": ADDON},
                "ownerReferences": [{"apiVersion": "addon.open-cluster-management.io/v1alpha1", "kind": "ManagedClusterAddOn", "name": ADDON, "uid": addon.metadata.uid, "blockOwnerDeletion": true}]},
            "spec": {"workload": {"manifests": manifests}}});
        self.apply(hub, &works(), &work).await
    }

    /// `cleanUpSubmarinerAgent`: the resource ManifestWork first (waited for up to two
    /// minutes), then the operator's; the cluster's ServiceAccount and RoleBinding in the
    /// broker namespace; the set's Broker and globalnet ConfigMap when no other cluster of
    /// the set keeps a `submariner` add-on (`deleteGlobalBrokerResourcesIfNecessary`);
    /// last the add-on's finalizer.
    async fn cleanup(&self, hub: &kube::Client, cluster: &str, set: &str) -> Result<(), Error> {
        let work_api: Api<DynamicObject> = Api::namespaced_with(hub.clone(), cluster, &works());
        match work_api.get_opt(RESOURCE_WORK).await? {
            None => delete(&work_api, OPERATOR_WORK).await?,
            Some(w) => match &w.metadata.deletion_timestamp {
                None => {
                    delete(&work_api, RESOURCE_WORK).await?;
                    self.forget(cluster);
                    return Ok(());
                }
                Some(t) if k8s_openapi::jiff::Timestamp::now() < t.0 + k8s_openapi::jiff::SignedDuration::from_secs(WORK_DELETION_TIMEOUT) => return Ok(()),
                Some(_) => {}
            },
        }
        self.forget(cluster);
        // `removeClusterRBACFiles`: found by the ServiceAccount's label.
        let sas: Api<DynamicObject> = Api::all_with(hub.clone(), &core("ServiceAccount", "serviceaccounts"));
        let found = sas.list(&ListParams::default().labels(&format!("cluster.open-cluster-management.io/submariner-cluster-sa={cluster}"))).await?.items;
        if let Some(sa) = found.first() {
            let ns = sa.metadata.namespace.clone().unwrap_or_default();
            delete(&Api::namespaced_with(hub.clone(), &ns, &rbac("RoleBinding", "rolebindings")), &format!("submariner-k8s-broker-cluster-{cluster}")).await?;
            delete(&Api::namespaced_with(hub.clone(), &ns, &core("ServiceAccount", "serviceaccounts")), cluster).await?;
        }
        if !set.is_empty() {
            let mcs = Api::<DynamicObject>::all_with(hub.clone(), &managed_clusters()).list(&ListParams::default().labels(&format!("{CLUSTERSET_LABEL}={set}"))).await?.items;
            let mut kept = false;
            for m in &mcs {
                let other = Api::<DynamicObject>::namespaced_with(hub.clone(), &name_of(m), &addons()).get_opt(ADDON).await?;
                kept |= other.is_some_and(|a| a.metadata.deletion_timestamp.is_none());
            }
            if !kept {
                let ns = broker_namespace(set);
                delete(&Api::namespaced_with(hub.clone(), &ns, &core("ConfigMap", "configmaps")), GLOBALNET_CONFIGMAP).await?;
                delete(&Api::namespaced_with(hub.clone(), &ns, &brokers()), BROKER).await?;
            }
        }
        let api: Api<DynamicObject> = Api::namespaced_with(hub.clone(), cluster, &addons());
        if let Some(a) = api.get_opt(ADDON).await?
            && let Some(patch) = finalizer_patch(&a.metadata, ADDON_FINALIZER, false)
        {
            api.patch(ADDON, &PatchParams::default(), &Patch::Merge(&patch)).await?;
        }
        Ok(())
    }

    /// `deploySubmarinerAgent`: the cluster's ServiceAccount and RoleBinding in the broker
    /// namespace (an error while the broker controller has not made it), then the Broker:
    /// without it `SubmarinerBrokerConfigApplied=False` reason `BrokerConfigMissing` (the
    /// message stays empty: upstream puts it in an event only) and nothing is deployed;
    /// with it the condition turns True, the SubmarinerConfig is marked applied, and the
    /// operator's ManifestWork (namespace, OperatorGroup, OLM Subscription) and the
    /// resource ManifestWork (IPsec and broker Secrets, the Submariner CR) are applied.
    async fn deploy(&self, hub: &kube::Client, hub_server: &str, cluster: &str, set: &str, addon: &DynamicObject, mc: &DynamicObject) -> Result<(), Error> {
        let ns = broker_namespace(set);
        self.apply(
            hub,
            &core("ServiceAccount", "serviceaccounts"),
            &json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": cluster, "namespace": ns, "labels": {"cluster.open-cluster-management.io/submariner-cluster-sa": cluster}}}),
        )
        .await?;
        self.apply(
            hub,
            &rbac("RoleBinding", "rolebindings"),
            &json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": format!("submariner-k8s-broker-cluster-{cluster}"), "namespace": ns},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "submariner-k8s-broker-cluster"},
                "subjects": [{"kind": "ServiceAccount", "name": cluster, "namespace": ns}]}),
        )
        .await?;
        // `createGNConfigMapIfNecessary`: an existing globalnet ConfigMap skips the Broker
        // read; the backup label below then fails without a Broker (and retries).
        let cms: Api<DynamicObject> = Api::namespaced_with(hub.clone(), &ns, &core("ConfigMap", "configmaps"));
        let broker_api: Api<DynamicObject> = Api::namespaced_with(hub.clone(), &ns, &brokers());
        if cms.get_opt(GLOBALNET_CONFIGMAP).await?.is_none() {
            let Some(broker) = broker_api.get_opt(BROKER).await? else {
                return Ok(set_addon_conditions(hub, cluster, &[cond("SubmarinerBrokerConfigApplied", "False", "BrokerConfigMissing", "")]).await?);
            };
            let enabled = broker.data.pointer("/spec/globalnetEnabled").and_then(Value::as_bool).unwrap_or(false);
            let (cidr, size) = if enabled {
                (broker.data.pointer("/spec/globalnetCIDRRange").and_then(Value::as_str).unwrap_or("242.0.0.0/8").to_owned(), broker.data.pointer("/spec/defaultGlobalnetClusterSize").and_then(Value::as_u64).unwrap_or(65536))
            } else {
                (String::new(), 0)
            };
            let cm: DynamicObject = serde_json::from_value(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": GLOBALNET_CONFIGMAP, "namespace": ns, "labels": {BACKUP_LABEL: ADDON}},
                "data": {"globalnetEnabled": enabled.to_string(), "globalnetCidrRange": cidr, "globalnetClusterSize": size.to_string(), "clusterinfo": "[]"}}))
            .map_err(Error::Object)?;
            crate::emulate::present(cms.create(&PostParams::default(), &cm).await)?;
        }
        let broker = broker_api.get(BROKER).await?;
        if !broker.metadata.labels.as_ref().is_some_and(|l| l.contains_key(BACKUP_LABEL)) {
            let patch = json!({"metadata": {"labels": {BACKUP_LABEL: ADDON}, "resourceVersion": broker.metadata.resource_version}});
            broker_api.patch(BROKER, &PatchParams::default(), &Patch::Merge(&patch)).await?;
        }
        set_addon_conditions(hub, cluster, &[cond("SubmarinerBrokerConfigApplied", "True", "BrokerConfigApplied", "")]).await?;
        let install_ns = install_namespace(addon);
        let config_api: Api<DynamicObject> = Api::namespaced_with(hub.clone(), cluster, &configs());
        let config = config_api.get_opt(ADDON).await?;
        if let Some(c) = &config {
            self.config_applied(&config_api, c, mc).await?;
        }
        let spec = |k: &str| config.as_ref().and_then(|c| c.data.pointer(&format!("/spec/{k}"))).cloned();
        let sub = |k: &str, default: &str| spec("subscriptionConfig").and_then(|s| s.get(k).and_then(Value::as_str).map(str::to_owned)).filter(|s| !s.is_empty()).unwrap_or_else(|| default.to_owned());
        let skip_group = config.as_ref().and_then(|c| c.metadata.annotations.as_ref()).is_some_and(|a| a.contains_key("skipOperatorGroup"));
        // `submarinerbrokerinfo/brokerinfo.go` defaults, overridden by the SubmarinerConfig.
        let mut subscription = json!({"apiVersion": "operators.coreos.com/v1alpha1", "kind": "Subscription", "metadata": {"name": "submariner", "namespace": install_ns},
            "spec": {"channel": sub("channel", "stable-0.24"), "installPlanApproval": sub("installPlanApproval", "Automatic"), "name": "submariner",
                "source": sub("source", "redhat-operators"), "sourceNamespace": sub("sourceNamespace", "openshift-marketplace")}});
        let starting = sub("startingCSV", "");
        if !starting.is_empty() {
            subscription["spec"]["startingCSV"] = json!(starting);
        }
        let mut operator = vec![
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": install_ns}}),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "open-cluster-management:submariner-addon-operatorgroups-aggregate-clusterrole",
                "labels": {"rbac.authorization.k8s.io/aggregate-to-admin": "true"}}, "rules": [{"apiGroups": ["operators.coreos.com"], "resources": ["operatorgroups"], "verbs": ["get", "create", "delete", "update"]}]}),
        ];
        if !skip_group {
            operator.push(json!({"apiVersion": "operators.coreos.com/v1", "kind": "OperatorGroup", "metadata": {"name": "submariner-operator", "namespace": install_ns},
                "spec": {"targetNamespaces": ["submariner-operator"]}}));
        }
        operator.push(subscription);
        self.work(hub, cluster, OPERATOR_WORK, operator).await?;
        let psk = Api::<DynamicObject>::namespaced_with(hub.clone(), &ns, &core("Secret", "secrets")).get(PSK_SECRET).await?;
        let psk = psk.data.pointer("/data/psk").cloned().unwrap_or(Value::Null);
        let num = |k: &str, d: i64| spec(k).and_then(|v| v.as_i64()).unwrap_or(d);
        let flag = |k: &str, d: bool| spec(k).and_then(|v| v.as_bool()).unwrap_or(d);
        let resources = vec![
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": PSK_SECRET, "namespace": install_ns}, "type": "Opaque", "data": {"psk": psk}}),
            // brokerinfo reads the cluster's ServiceAccount token and the hub's CA; the
            // emulated broker needs neither, so they are stand-ins.
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "submariner-broker-secret", "namespace": install_ns}, "type": "Opaque",
                "data": {"token": base64::engine::general_purpose::STANDARD.encode("emulated"), "ca.crt": base64::engine::general_purpose::STANDARD.encode("emulated")}}),
            json!({"apiVersion": "submariner.io/v1alpha1", "kind": "Submariner", "metadata": {"name": "submariner", "namespace": install_ns},
                "spec": {"broker": "k8s", "brokerK8sApiServer": hub_server.trim_start_matches("https://"), "brokerK8sSecret": "submariner-broker-secret", "brokerK8sRemoteNamespace": ns,
                    "brokerK8sInsecure": flag("insecureBrokerConnection", false), "cableDriver": spec("cableDriver").and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_else(|| "libreswan".into()),
                    "ceIPSecNATTPort": num("IPSecNATTPort", 4500), "ceIPSecPSKSecret": PSK_SECRET, "clusterCIDR": "", "serviceCIDR": "", "globalCIDR": spec("globalCIDR").unwrap_or(json!("")),
                    "clusterID": cluster, "namespace": install_ns, "natEnabled": flag("NATTEnable", true), "serviceDiscoveryEnabled": true, "colorCodes": "blue", "debug": flag("Debug", false)}}),
        ];
        self.work(hub, cluster, RESOURCE_WORK, resources).await
    }

    async fn work(&self, hub: &kube::Client, cluster: &str, name: &str, manifests: Vec<Value>) -> Result<(), Error> {
        let work = json!({"apiVersion": "work.open-cluster-management.io/v1", "kind": "ManifestWork", "metadata": {"name": name, "namespace": cluster},
            "spec": {"workload": {"manifests": manifests}}});
        self.apply(hub, &works(), &work).await
    }

    /// `updateSubmarinerConfigStatus`: `SubmarinerConfigApplied=True` and the cluster's
    /// info from its claims (the network type, set by the agent, kept).
    async fn config_applied(&self, api: &Api<DynamicObject>, config: &DynamicObject, mc: &DynamicObject) -> Result<(), Error> {
        let claims: Vec<Value> = mc.data.pointer("/status/clusterClaims").and_then(Value::as_array).cloned().unwrap_or_default();
        let claim = |n: &str| claims.iter().find(|c| c["name"] == n).and_then(|c| c["value"].as_str()).unwrap_or("").to_owned();
        let mut info = json!({"clusterName": name_of(mc), "vendor": claim("product.open-cluster-management.io"), "platform": claim("platform.open-cluster-management.io"),
            "region": claim("region.open-cluster-management.io"), "vendorVersion": claim("version.openshift.io")});
        if let Some(nt) = config.data.pointer("/status/managedClusterInfo/networkType") {
            info["networkType"] = nt.clone();
        }
        let old = config.data.pointer("/status/conditions").and_then(Value::as_array).cloned().unwrap_or_default();
        let applied = old.iter().any(|c| c["type"] == "SubmarinerConfigApplied" && c["status"] == "True");
        if applied && config.data.pointer("/status/managedClusterInfo") == Some(&info) {
            return Ok(());
        }
        let mut conds: Vec<Value> = old.into_iter().filter(|c| c["type"] != "SubmarinerConfigApplied").collect();
        conds.push(cond("SubmarinerConfigApplied", "True", "SubmarinerConfigApplied", "SubmarinerConfig was applied"));
        let patch = json!({"metadata": {"resourceVersion": config.metadata.resource_version}, "status": {"conditions": conds, "managedClusterInfo": info}});
        api.patch_status(ADDON, &PatchParams::default(), &Patch::Merge(&patch)).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broker_namespaces_are_named_as_upstream_names_them() {
        assert_eq!(broker_namespace("submariner"), "submariner-broker");
        let long = "a".repeat(57);
        assert_eq!(broker_namespace(&long).len(), 59, "past 63 characters the head loses five");
        assert_eq!(broker_namespace(&"b".repeat(56)).len(), 63);
    }
}
