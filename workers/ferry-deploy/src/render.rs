//! Renders an app into Kubernetes objects and OCM ManifestWorks (pure): per component a
//! Deployment, a Service for its ports and an Ingress for public exposure, the Secrets it
//! references, and the feedback rules that bring readiness back to the hub.

use std::collections::{BTreeMap, BTreeSet};

use ferry_kube::conditions::{DeploymentCounts, Rollout};
use ferry_kube::kinds::ManifestWork;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::ownership::{FERRY, MANAGED_BY};
use crate::spec::{Component, DeployApp, Port};

/// Field manager of everything the deploy worker applies.
pub const MANAGER: &str = "ferry-deploy";
/// The field manager the work agent applies a ManifestWork's objects as (OCM requires the
/// `work-agent` prefix).
pub const WORK_FIELD_MANAGER: &str = "work-agent-ferry-deploy";
/// Label naming the app on every object.
pub const APP_LABEL: &str = "ferry.io/app";
/// Label naming the app's owner on its hub objects.
pub const OWNER_LABEL: &str = "ferry.io/owner";
/// Annotation naming the task that last wrote an object.
pub const TASK_ANNOTATION: &str = "ferry.io/task";
/// The feedback value that brings a Deployment's [`TASK_ANNOTATION`] back to the hub
/// ([`feedback_is_current`]).
pub const FEEDBACK_TASK: &str = "task";

/// Component name → the clusters it runs on.
pub type Targets = BTreeMap<String, Vec<String>>;

/// What an app is on the fleet: its spec and where each component runs. Recorded on the
/// hub (never a Secret's value: the spec holds only references).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppState {
    /// The spec last deployed.
    pub spec: DeployApp,
    /// Where its components run.
    pub targets: Targets,
}

impl AppState {
    /// Cluster → its components, in spec order.
    pub fn by_cluster(&self) -> BTreeMap<String, Vec<&Component>> {
        let mut out: BTreeMap<String, Vec<&Component>> = BTreeMap::new();
        for c in &self.spec.components {
            for cl in self.targets.get(&c.name).into_iter().flatten() {
                out.entry(cl.clone()).or_default().push(c);
            }
        }
        out
    }

    /// The clusters the app runs on.
    pub fn clusters(&self) -> BTreeSet<String> {
        self.targets.values().flatten().cloned().collect()
    }
}

/// One object a change of the app from one state to another removes.
#[derive(Debug, Clone, PartialEq)]
pub struct Removed {
    /// Where it is deleted: the hub (a ManifestWork; the cluster's work agent removes its
    /// manifests) or the cluster itself (direct delivery).
    pub at: Removal,
    /// The cluster the app leaves (or stops running these objects on).
    pub cluster: String,
    /// The object, named (what a delete needs).
    pub object: Value,
}

/// Where a [`Removed`] object is deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removal {
    /// The app's ManifestWork on the hub, in the cluster's namespace.
    Hub,
    /// An object on the cluster (direct delivery).
    Cluster,
}

/// What going from `from` to `to` (`None`: the app deleted) removes, in the order to delete
/// it: `from`'s ManifestWorks of the clusters neither `to` nor `keep` runs on; or, for
/// direct delivery, `from`'s objects `to` does not render on the same cluster, each
/// cluster's in reverse order (dependents before what they need, the Namespace last).
/// `keep`: clusters to leave alone besides `to`'s (a dry run's: those of components placed
/// at run time). The converge step and the dry run share it.
pub fn removed(from: &AppState, to: Option<&AppState>, keep: &BTreeSet<String>) -> Vec<Removed> {
    let identity = |o: &Value| {
        let s = |p: &str| o.pointer(p).and_then(Value::as_str).unwrap_or("").to_owned();
        format!("{} {} {}/{}", s("/apiVersion"), s("/kind"), s("/metadata/namespace"), s("/metadata/name"))
    };
    match from.spec.delivery {
        crate::spec::Delivery::ManifestWork => {
            let mut kept = to.map(AppState::clusters).unwrap_or_default();
            kept.extend(keep.iter().cloned());
            from.clusters()
                .difference(&kept)
                .map(|c| Removed { at: Removal::Hub, cluster: c.clone(), object: work_ref(&from.spec, c) })
                .collect()
        }
        crate::spec::Delivery::Direct => {
            let wanted: BTreeSet<(String, String)> = to
                .map(|t| t.by_cluster().into_iter().flat_map(|(cl, comps)| objects(&t.spec, &comps, &BTreeMap::new()).iter().map(|o| (cl.clone(), identity(o))).collect::<Vec<_>>()).collect())
                .unwrap_or_default();
            let mut out = Vec::new();
            for (cluster, comps) in from.by_cluster() {
                for object in objects(&from.spec, &comps, &BTreeMap::new()).into_iter().rev() {
                    if !wanted.contains(&(cluster.clone(), identity(&object))) {
                        out.push(Removed { at: Removal::Cluster, cluster: cluster.clone(), object });
                    }
                }
            }
            out
        }
    }
}

/// A Secret's type and data as read on the hub.
#[derive(Debug, Clone, Default)]
pub struct SecretData {
    /// `type` (Opaque, kubernetes.io/dockerconfigjson, kubernetes.io/tls).
    pub type_: String,
    /// Base64 values, as the API returns them.
    pub data: BTreeMap<String, String>,
}

/// Name of the app's ManifestWork on every cluster.
pub fn work_name(app: &DeployApp) -> String {
    format!("{}-{}", app.namespace(), app.name)
}

/// The app's ManifestWork for `cluster`, named only (what a delete or a lookup needs).
pub fn work_ref(app: &DeployApp, cluster: &str) -> Value {
    json!({"apiVersion": "work.open-cluster-management.io/v1", "kind": "ManifestWork", "metadata": {"name": work_name(app), "namespace": cluster}})
}

/// Name of a component's Placement on the hub.
pub fn placement_name(app: &DeployApp, component: &str) -> String {
    format!("{}-{component}", app.name)
}

/// A port's name (`p<port>` by default).
pub fn port_name(p: &Port) -> String {
    p.name.clone().unwrap_or_else(|| format!("p{}", p.port))
}

fn selector(app: &DeployApp, c: &Component) -> Value {
    json!({"app.kubernetes.io/name": c.name, "app.kubernetes.io/instance": app.name})
}

fn labels(app: &DeployApp, c: Option<&Component>) -> Value {
    let mut l = json!({MANAGED_BY: FERRY, APP_LABEL: app.name, "app.kubernetes.io/part-of": app.name});
    if let Some(c) = c {
        l["app.kubernetes.io/name"] = json!(c.name);
        l["app.kubernetes.io/instance"] = json!(app.name);
    }
    l
}

fn deployment(app: &DeployApp, c: &Component) -> Value {
    let env: Vec<Value> = c
        .env
        .iter()
        .map(|e| match &e.secret {
            Some(s) => json!({"name": e.name, "valueFrom": {"secretKeyRef": {"name": s.name, "key": s.key}}}),
            None => json!({"name": e.name, "value": e.value.clone().unwrap_or_default()}),
        })
        .collect();
    let ports: Vec<Value> = c
        .ports
        .iter()
        .map(|p| json!({"name": port_name(p), "containerPort": p.port, "protocol": p.protocol.clone().unwrap_or_else(|| "TCP".into())}))
        .collect();
    let mut requests = serde_json::Map::new();
    if let Some(cpu) = &c.cpu {
        requests.insert("cpu".into(), json!(cpu));
    }
    if let Some(m) = &c.memory {
        requests.insert("memory".into(), json!(m));
    }
    let mut pod = json!({"containers": [{"name": c.name, "image": c.image, "env": env, "ports": ports, "resources": {"requests": requests}}]});
    if let Some(s) = &c.image_pull_secret {
        pod["imagePullSecrets"] = json!([{"name": s}]);
    }
    let mut tpl_labels = selector(app, c);
    tpl_labels["app.kubernetes.io/part-of"] = json!(app.name);
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": c.name, "namespace": c.namespace(app), "labels": labels(app, Some(c))},
        "spec": {"replicas": c.replicas(), "selector": {"matchLabels": selector(app, c)},
                 "template": {"metadata": {"labels": tpl_labels}, "spec": pod}},
    })
}

fn service(app: &DeployApp, c: &Component) -> Value {
    let ports: Vec<Value> = c
        .ports
        .iter()
        .map(|p| json!({"name": port_name(p), "port": p.port, "targetPort": p.port, "protocol": p.protocol.clone().unwrap_or_else(|| "TCP".into())}))
        .collect();
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": c.name, "namespace": c.namespace(app), "labels": labels(app, Some(c))},
        "spec": {"type": c.service_type.clone().unwrap_or_else(|| "ClusterIP".into()), "selector": selector(app, c), "ports": ports},
    })
}

fn ingress(app: &DeployApp, c: &Component) -> Option<Value> {
    let i = c.ingress.as_ref()?;
    let port = i.port.or(c.ports.first().map(|p| p.port))?;
    let mut spec = json!({"rules": [{"host": i.host, "http": {"paths": [{
        "path": i.path.clone().unwrap_or_else(|| "/".into()), "pathType": "Prefix",
        "backend": {"service": {"name": c.name, "port": {"number": port}}}}]}}]});
    if let Some(tls) = &i.tls_secret {
        spec["tls"] = json!([{"hosts": [i.host], "secretName": tls}]);
    }
    Some(json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
        "metadata": {"name": c.name, "namespace": c.namespace(app), "labels": labels(app, Some(c))},
        "spec": spec,
    }))
}

fn secret(app: &DeployApp, namespace: &str, name: &str, d: Option<&SecretData>) -> Value {
    let (type_, data) = d.map(|d| (d.type_.clone(), json!(d.data))).unwrap_or_else(|| ("Opaque".into(), json!({})));
    json!({
        "apiVersion": "v1", "kind": "Secret", "type": type_,
        "metadata": {"name": name, "namespace": namespace, "labels": labels(app, None)},
        "data": data,
    })
}

/// The objects of `components` on one cluster, in apply order (namespaces, Secrets,
/// Deployments, Services, Ingresses). Secrets missing from `secrets` render empty (enough
/// to name them for deletion).
pub fn objects(app: &DeployApp, components: &[&Component], secrets: &BTreeMap<String, SecretData>) -> Vec<Value> {
    let namespaces: BTreeSet<&str> = components.iter().map(|c| c.namespace(app)).collect();
    let mut out: Vec<Value> = namespaces
        .iter()
        .map(|ns| json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": labels(app, None)}}))
        .collect();
    let mut shipped = BTreeSet::new();
    for c in components {
        for s in c.secrets() {
            if shipped.insert((c.namespace(app), s.clone())) {
                out.push(secret(app, c.namespace(app), &s, secrets.get(&s)));
            }
        }
    }
    out.extend(components.iter().map(|c| deployment(app, c)));
    out.extend(components.iter().filter(|c| !c.ports.is_empty()).map(|c| service(app, c)));
    out.extend(components.iter().filter_map(|c| ingress(app, c)));
    out
}

/// The resource (plural) of a kind [`objects`] renders, for a ManifestWork's resource
/// identifiers.
fn resource_of(kind: &str) -> String {
    match kind {
        "Ingress" => "ingresses".to_owned(),
        k => format!("{}s", k.to_ascii_lowercase()),
    }
}

/// The manifest config of one rendered object: how the work agent writes it, and the
/// feedback [`readiness`] and addresses come from.
///
/// - Server-side apply as [`WORK_FIELD_MANAGER`] without force: a field another manager
///   owns is a conflict (Applied=False with the API server's message), never taken over
///   (ocm `pkg/work/spoke/apply/server_side_apply.go`: `Force` comes from
///   `updateStrategy.serverSideApply.force`, default false, and an `IsConflict` answer is
///   returned as `ServerSideApplyConflictError`; api `work/v1/types.go`,
///   `ServerSideApplyConfig`). The default strategy, `Update`, would replace an object
///   that is there, whoever made it, so every manifest names its strategy.
/// - A Namespace is `CreateOnly`: made when missing, a namespace that is there is not
///   written (ocm `pkg/work/spoke/apply/create_only_apply.go`).
fn manifest_config(o: &Value) -> Value {
    let s = |p: &str| o.pointer(p).and_then(Value::as_str).unwrap_or("");
    let kind = s("/kind");
    let group = s("/apiVersion").rsplit_once('/').map_or("", |(g, _)| g);
    let mut id = json!({"group": group, "resource": resource_of(kind), "name": s("/metadata/name")});
    if !s("/metadata/namespace").is_empty() {
        id["namespace"] = json!(s("/metadata/namespace"));
    }
    // The work agent applies as this field manager; OCM's ManifestWork CRD requires it to
    // start with `work-agent` (api v1.3.0, `serverSideApply.fieldManager` pattern).
    let strategy = match kind {
        "Namespace" => json!({"type": ferry_kube::orphans::CREATE_ONLY}),
        _ => json!({"type": "ServerSideApply", "serverSideApply": {"fieldManager": WORK_FIELD_MANAGER, "force": false}}),
    };
    let mut c = json!({"resourceIdentifier": id, "updateStrategy": strategy});
    // Feedback by watch: the work agent reports a change of the resource at once, where by
    // poll (the default) it reads it every 10-19 s (ocm `pkg/work/spoke/controllers/
    // statuscontroller/availablestatus_controller.go`, `RegisterInformer`; OCM 1.2+; an
    // older agent polls).
    let watched = |mut c: Value| {
        c["feedbackScrapeType"] = json!("Watch");
        c
    };
    match kind {
        "Deployment" => {
            c["feedbackRules"] = json!([
                {"type": "WellKnownStatus"},
                {"type": "JSONPaths", "jsonPaths": [
                    {"name": "updatedReplicas", "path": ".status.updatedReplicas"},
                    {"name": "observedGeneration", "path": ".status.observedGeneration"},
                    {"name": "generation", "path": ".metadata.generation"},
                    // Which apply the values were read after (`feedback_is_current`); a
                    // dot in a key is escaped for upstream's parser (k8s.io/client-go/util/
                    // jsonpath, `parseField`).
                    {"name": FEEDBACK_TASK, "path": format!(".metadata.annotations.{}", TASK_ANNOTATION.replace('.', "\\."))},
                ]},
            ]);
            c = watched(c);
        }
        "Service" => {
            c["feedbackRules"] = json!([{"type": "JSONPaths", "jsonPaths": [
                {"name": "clusterIP", "path": ".spec.clusterIP"},
                {"name": "loadBalancerIP", "path": ".status.loadBalancer.ingress[0].ip"},
            ]}]);
            c = watched(c);
        }
        _ => {}
    }
    c
}

/// The ManifestWork that carries `components` to `cluster`: every manifest server-side
/// applied without force (a Namespace created only when missing), feedback for readiness
/// and addresses, and on deletion everything it applied removed but its namespaces.
///
/// The work agent owns (and on deletion removes) whatever it applied, an object that was
/// there before included (ocm `pkg/work/spoke/apply/server_side_apply.go` and
/// `create_only_apply.go` call `helper.ApplyOwnerReferences` on success;
/// `pkg/work/helper/helpers.go`, `DeleteAppliedResources`, deletes what carries that
/// owner). So the namespaces in `found` (there before, not made by Ferry for this app:
/// the caller looks through the cluster's kubeconfig, and lists every namespace when it
/// cannot) are orphaned (`SelectivelyOrphan`: `helpers.go`, `OwnedByTheWork`, and
/// `manifestwork_reconciler.go`, `manageOwnerRef`, keep the work's owner off them): a
/// namespace Ferry did not create is never deleted, and one it created goes with the app.
pub fn manifest_work(app: &DeployApp, cluster: &str, components: &[&Component], secrets: &BTreeMap<String, SecretData>, task: &str, found: &BTreeSet<String>) -> Value {
    let mut manifests = objects(app, components, secrets);
    // Each Deployment carries the task that applies it, read back by a feedback rule
    // (`feedback_is_current`).
    for m in manifests.iter_mut().filter(|m| m["kind"] == "Deployment") {
        m["metadata"]["annotations"][TASK_ANNOTATION] = json!(task);
    }
    let configs: Vec<Value> = manifests.iter().map(manifest_config).collect();
    let delete_option = ferry_kube::orphans::delete_option(&manifests, found);
    json!({
        "apiVersion": "work.open-cluster-management.io/v1", "kind": "ManifestWork",
        "metadata": {
            "name": work_name(app), "namespace": cluster,
            "labels": {MANAGED_BY: FERRY, APP_LABEL: app.name, OWNER_LABEL: owner_label(&app.owner)},
            "annotations": {TASK_ANNOTATION: task},
        },
        "spec": {
            "workload": {"manifests": manifests},
            "deleteOption": delete_option,
            "manifestConfigs": configs,
        },
    })
}

/// The owner as a label value (labels allow 63 characters of `[A-Za-z0-9._-]`).
pub fn owner_label(owner: &str) -> String {
    let s: String = owner.chars().map(|c| if c.is_ascii_alphanumeric() || "._-".contains(c) { c } else { '_' }).take(63).collect();
    s.trim_matches(|c: char| !c.is_ascii_alphanumeric()).to_owned()
}

/// The Placement of a component (OCM v1beta1).
pub fn placement(app: &DeployApp, c: &Component, task: &str) -> Option<Value> {
    let p = c.placement.as_ref()?;
    let mut spec = json!({"numberOfClusters": p.clusters.unwrap_or(1)});
    if !p.cluster_sets.is_empty() {
        spec["clusterSets"] = json!(p.cluster_sets);
    }
    if !p.labels.is_empty() {
        let labels: BTreeMap<&String, &String> = p.labels.iter().collect();
        spec["predicates"] = json!([{"requiredClusterSelector": {"labelSelector": {"matchLabels": labels}}}]);
    }
    if let Some(score) = &p.score {
        // Exact: rank by the score alone. Additive would keep the built-in Balance and Steady
        // at weight 1 (ocm pkg/placement/controllers/scheduling/schedule.go, getWeights), so
        // a cluster decided before (+100) would outrank a better-scored one.
        spec["prioritizerPolicy"] = json!({"mode": "Exact", "configurations": [{
            "scoreCoordinate": {"type": "AddOn", "addOn": {"resourceName": score, "scoreName": p.score_item.clone().unwrap_or_else(|| "score".into())}},
            "weight": 1}]});
    }
    Some(json!({
        "apiVersion": "cluster.open-cluster-management.io/v1beta1", "kind": "Placement",
        "metadata": {"name": placement_name(app, &c.name), "namespace": app.namespace(),
                     "labels": {MANAGED_BY: FERRY, APP_LABEL: app.name}, "annotations": {TASK_ANNOTATION: task}},
        "spec": spec,
    }))
}

/// The feedback values of one resource of a ManifestWork (by kind, namespace and name).
pub fn feedback(work: &ManifestWork, kind: &str, namespace: &str, name: &str) -> BTreeMap<String, String> {
    ferry_kube::kinds::feedback_values(work, |meta| meta["kind"] == kind && meta["name"] == name && meta["namespace"] == namespace).into_iter().collect()
}

/// Whether a Deployment's feedback `values` were read from the object as `work` applies it
/// now: its [`FEEDBACK_TASK`] value is the task annotation of the work's manifest.
///
/// Applied at the work's generation does not make the feedback current. Upstream applying
/// and feedback are separate controllers: the apply controller sets Applied with the new
/// observedGeneration (ocm `pkg/work/spoke/controllers/manifestcontroller/
/// manifestwork_reconciler.go`) and keeps the old feedback on purpose (`pkg/work/helper/
/// helpers.go`, `mergeManifestCondition`: "the statusFeedbacks should keep the old one");
/// the AvailableStatusController reads the objects again later (`pkg/work/spoke/controllers/
/// statuscontroller/availablestatus_controller.go`, every `--status-sync-interval`, 10 s).
/// Until then the feedback is the previous Deployment's, whose rollout was done: a new image
/// that never becomes ready would pass. Nothing upstream ties feedback to a generation (no
/// observedGeneration on the feedback or its StatusFeedbackSynced condition, and the
/// Deployment's own generation after the apply is not reported), so the Deployment carries
/// its task in an annotation and a JSONPaths rule (`pkg/work/spoke/statusfeedback/reader.go`
/// evaluates it against the whole object) reads it back with the counters of the same read.
/// The annotation bumps the Deployment's generation (kubernetes `pkg/registry/apps/
/// deployment/strategy.go`, `PrepareForUpdate`: annotations are copied to ReplicaSets), so
/// `generation` against `observedGeneration` still says whether its controller saw it. A
/// work without the annotation (written by an older Ferry) has nothing to compare.
pub fn feedback_is_current(work: &ManifestWork, values: &BTreeMap<String, String>, namespace: &str, name: &str) -> bool {
    let manifests = work.spec.pointer("/workload/manifests").and_then(Value::as_array).into_iter().flatten();
    let stamp = manifests
        .filter(|m| m["kind"] == "Deployment" && m["metadata"]["name"] == name && m["metadata"]["namespace"] == namespace)
        .find_map(|m| m["metadata"]["annotations"][TASK_ANNOTATION].as_str());
    stamp.is_none_or(|s| values.get(FEEDBACK_TASK).map(String::as_str) == Some(s))
}

/// A component's rollout on one cluster from its Deployment's feedback values (the
/// WellKnownStatus counters and the JSONPaths [`manifest_work`] asks for), judged as
/// `kubectl rollout status` judges it; a value not reported yet counts as not there yet.
pub fn readiness(values: &BTreeMap<String, String>, wanted: i32) -> Rollout {
    let n = |k: &str| values.get(k).and_then(|v| v.parse::<i64>().ok());
    let counts = DeploymentCounts {
        generation: n("generation"),
        observed_generation: n("observedGeneration"),
        replicas: n("Replicas"),
        updated: n("updatedReplicas"),
        ready: n("ReadyReplicas"),
        available: n("AvailableReplicas"),
    };
    counts.rollout(i64::from(wanted))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{EnvVar, IngressSpec, PlacementSpec, SecretKeyRef};

    #[test]
    fn removed_is_what_the_new_state_no_longer_has_where_it_had_it() {
        let targets = |pairs: &[(&str, &[&str])]| pairs.iter().map(|(c, cl)| ((*c).to_owned(), cl.iter().map(|s| (*s).to_owned()).collect())).collect::<Targets>();
        let mut direct = app();
        direct.delivery = crate::spec::Delivery::Direct;
        let from = AppState { spec: direct.clone(), targets: targets(&[("web", &["member-1"]), ("db", &["member-1", "member-2"])]) };
        // db leaves member-2; web and db stay on member-1.
        let to = AppState { spec: direct.clone(), targets: targets(&[("web", &["member-1"]), ("db", &["member-1"])]) };
        let r = removed(&from, Some(&to), &BTreeSet::new());
        assert!(r.iter().all(|r| r.cluster == "member-2" && r.at == Removal::Cluster), "{r:?}");
        let kinds: Vec<&str> = r.iter().map(|r| r.object["kind"].as_str().unwrap()).collect();
        // Reverse render order: the Namespace last.
        assert_eq!(kinds.last(), Some(&"Namespace"), "{kinds:?}");
        assert!(kinds.contains(&"Deployment"), "{kinds:?}");
        // The app deleted: everything, each cluster's Namespace last.
        let all = removed(&from, None, &BTreeSet::new());
        assert_eq!(all.iter().filter(|r| r.object["kind"] == "Namespace").count(), 2);
        assert_eq!(removed(&from, Some(&from), &BTreeSet::new()), []);
        // Through OCM: the ManifestWorks of the clusters left, on the hub; `keep` spares one.
        let from = AppState { spec: app(), targets: from.targets.clone() };
        let to = AppState { spec: app(), targets: targets(&[("web", &["member-1"])]) };
        let r = removed(&from, Some(&to), &BTreeSet::new());
        assert_eq!(r, [Removed { at: Removal::Hub, cluster: "member-2".into(), object: work_ref(&app(), "member-2") }]);
        assert_eq!(removed(&from, Some(&to), &BTreeSet::from(["member-2".to_owned()])), []);
    }

    fn app() -> DeployApp {
        DeployApp {
            name: "shop".into(),
            owner: "team a".into(),
            components: vec![
                Component {
                    name: "web".into(),
                    image: "nginx:1.27".into(),
                    replicas: Some(2),
                    ports: vec![Port { port: 80, ..Port::default() }],
                    ingress: Some(IngressSpec { host: "shop.example.com".into(), tls_secret: Some("shop-tls".into()), ..IngressSpec::default() }),
                    cluster: Some("member-1".into()),
                    ..Component::default()
                },
                Component {
                    name: "db".into(),
                    image: "postgres:16".into(),
                    env: vec![EnvVar { name: "POSTGRES_PASSWORD".into(), secret: Some(SecretKeyRef { name: "db".into(), key: "password".into() }), value: None }],
                    placement: Some(PlacementSpec { score: Some("ferry-resource-usage".into()), ..PlacementSpec::default() }),
                    ..Component::default()
                },
            ],
            ..DeployApp::default()
        }
    }

    #[test]
    fn a_cluster_gets_its_components_and_the_secrets_they_reference() {
        let a = app();
        let comps: Vec<&Component> = a.components.iter().collect();
        let secrets = BTreeMap::from([("db".to_owned(), SecretData { type_: "Opaque".into(), data: BTreeMap::from([("password".into(), "c2VjcmV0".into())]) })]);
        let objs = objects(&a, &comps, &secrets);
        let kinds: Vec<(&str, &str)> = objs.iter().map(|o| (o["kind"].as_str().unwrap(), o["metadata"]["name"].as_str().unwrap())).collect();
        assert_eq!(
            kinds,
            [("Namespace", "shop"), ("Secret", "shop-tls"), ("Secret", "db"), ("Deployment", "web"), ("Deployment", "db"), ("Service", "web"), ("Ingress", "web")]
        );
        assert_eq!(objs[2]["data"]["password"], "c2VjcmV0");
        let web = &objs[3];
        assert_eq!(web["spec"]["replicas"], 2);
        assert_eq!(web["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"], "web");
        assert_eq!(objs[4]["spec"]["template"]["spec"]["containers"][0]["env"][0]["valueFrom"]["secretKeyRef"]["key"], "password");
        assert_eq!(objs[6]["spec"]["tls"][0]["secretName"], "shop-tls");
    }

    #[test]
    fn the_manifest_work_asks_for_readiness_feedback_and_keeps_namespaces() {
        let a = app();
        let none = manifest_work(&a, "member-1", &[&a.components[0]], &BTreeMap::new(), "tsk_1", &BTreeSet::new());
        assert_eq!(none["spec"]["deleteOption"]["selectivelyOrphans"]["orphaningRules"], json!([]), "a namespace Ferry makes goes with the work");
        let w = manifest_work(&a, "member-1", &[&a.components[0]], &BTreeMap::new(), "tsk_1", &["shop".to_owned()].into());
        assert_eq!(w["metadata"]["namespace"], "member-1");
        assert_eq!(w["metadata"]["name"], "shop-shop");
        assert_eq!(w["metadata"]["labels"][OWNER_LABEL], "team_a");
        let configs = w["spec"]["manifestConfigs"].as_array().unwrap();
        let config = |resource: &str| configs.iter().find(|c| c["resourceIdentifier"]["resource"] == resource).unwrap_or_else(|| panic!("no config of {resource}"));
        assert_eq!(config("deployments")["feedbackRules"][0]["type"], "WellKnownStatus");
        assert_eq!(config("deployments")["resourceIdentifier"], json!({"group": "apps", "resource": "deployments", "name": "web", "namespace": "shop"}));
        assert_eq!(config("services")["feedbackRules"][0]["jsonPaths"][0]["name"], "clusterIP");
        // Read by watch: a rollout is reported as it happens, not on the agent's status sync.
        for resource in ["deployments", "services"] {
            assert_eq!(config(resource)["feedbackScrapeType"], "Watch", "{resource}");
        }
        // Every manifest names its strategy (the default, Update, replaces what is there).
        assert_eq!(configs.len(), w["spec"]["workload"]["manifests"].as_array().unwrap().len());
        for c in configs.iter().filter(|c| c["resourceIdentifier"]["resource"] != "namespaces") {
            let s = &c["updateStrategy"];
            assert_eq!(s["type"], "ServerSideApply", "{c}");
            assert_eq!(s["serverSideApply"]["force"], false, "no forced takeover: {c}");
            // OCM's CRD: `fieldManager` must match `^work-agent`.
            assert!(s["serverSideApply"]["fieldManager"].as_str().unwrap().starts_with("work-agent"), "{c}");
        }
        assert_eq!(config("ingresses")["resourceIdentifier"]["group"], "networking.k8s.io");
        assert_eq!(config("secrets")["resourceIdentifier"]["name"], "shop-tls");
        // A namespace is created only when missing, and never deleted with the work.
        let ns = config("namespaces");
        assert_eq!(ns["updateStrategy"]["type"], "CreateOnly");
        assert_eq!(ns["resourceIdentifier"], json!({"group": "", "resource": "namespaces", "name": "shop"}));
        assert_eq!(w["spec"]["deleteOption"]["propagationPolicy"], "SelectivelyOrphan");
        assert_eq!(w["spec"]["deleteOption"]["selectivelyOrphans"]["orphaningRules"], json!([{"group": "", "resource": "namespaces", "name": "shop"}]));
    }

    #[test]
    fn a_placement_prioritizes_by_the_named_score() {
        let a = app();
        let p = placement(&a, &a.components[1], "tsk_1").unwrap();
        assert_eq!(p["metadata"]["name"], "shop-db");
        assert_eq!(p["spec"]["numberOfClusters"], 1);
        assert_eq!(p["spec"]["prioritizerPolicy"]["configurations"][0]["scoreCoordinate"]["addOn"]["resourceName"], "ferry-resource-usage");
        assert_eq!(p["spec"]["prioritizerPolicy"]["configurations"][0]["scoreCoordinate"]["addOn"]["scoreName"], "score");
        assert!(placement(&a, &a.components[0], "t").is_none());
    }

    #[test]
    fn a_placement_ranks_by_the_score_alone_even_against_its_earlier_decision() {
        // Ranked as OCM's scheduler ranks: the cluster decided before (Steady +100 in
        // Additive mode) must not outrank one that now scores higher.
        use ferry_fleet::ocm_prioritizers::{Decision, rank};
        let a = app();
        let p = placement(&a, &a.components[1], "tsk_1").unwrap();
        let clusters = ["member-1".to_owned(), "member-2".to_owned()];
        let before = [Decision { namespace: a.namespace().to_owned(), placement: "shop-db".into(), clusters: vec!["member-1".into()] }];
        let ranked = rank(&p["spec"], a.namespace(), "shop-db", &clusters, &before, |c, _, _| if c == "member-2" { 80 } else { 30 }, |_, _| None).unwrap();
        assert_eq!(ranked[0].1, "member-2", "{ranked:?}");
    }

    #[test]
    fn feedback_is_read_per_resource() {
        let w: ManifestWork = serde_json::from_value(json!({"metadata": {"name": "w"}, "status": {"resourceStatus": {"manifests": [
            {"resourceMeta": {"kind": "Deployment", "name": "web", "namespace": "shop"},
             "statusFeedback": {"values": [{"name": "ReadyReplicas", "fieldValue": {"type": "Integer", "integer": 2}}]}},
            {"resourceMeta": {"kind": "Service", "name": "web", "namespace": "shop"},
             "statusFeedback": {"values": [{"name": "clusterIP", "fieldValue": {"type": "String", "string": "10.96.0.7"}}]}},
        ]}}}))
        .unwrap();
        assert_eq!(feedback(&w, "Deployment", "shop", "web"), BTreeMap::from([("ReadyReplicas".to_owned(), "2".to_owned())]));
        assert_eq!(feedback(&w, "Service", "shop", "web")["clusterIP"], "10.96.0.7");
        assert!(feedback(&w, "Deployment", "other", "web").is_empty());
    }

    #[test]
    fn feedback_counts_only_once_read_after_this_apply() {
        let a = app();
        let web = &a.components[0];
        let mut w: ManifestWork = serde_json::from_value(manifest_work(&a, "member-1", &[web], &BTreeMap::new(), "tsk_2", &BTreeSet::new())).unwrap();
        let ns = web.namespace(&a);
        let deployment = w.spec["workload"]["manifests"].as_array().unwrap().iter().find(|m| m["kind"] == "Deployment").unwrap().clone();
        assert_eq!(deployment["metadata"]["annotations"][TASK_ANNOTATION], "tsk_2", "the Deployment carries its task");
        let rules = w.spec["manifestConfigs"].as_array().unwrap().iter().find(|c| c["resourceIdentifier"]["resource"] == "deployments").unwrap()["feedbackRules"].to_string();
        assert!(rules.contains(r#"{"name":"task","path":".metadata.annotations.ferry\\.io/task"}"#), "{rules}");
        let values = |task: Option<&str>| {
            let mut v = BTreeMap::from([("ReadyReplicas".to_owned(), "2".to_owned())]);
            v.extend(task.map(|t| (FEEDBACK_TASK.to_owned(), t.to_owned())));
            v
        };
        assert!(feedback_is_current(&w, &values(Some("tsk_2")), ns, "web"));
        assert!(!feedback_is_current(&w, &values(Some("tsk_1")), ns, "web"), "the previous apply's object");
        assert!(!feedback_is_current(&w, &values(None), ns, "web"), "read before any apply of this Ferry");
        // A work an older Ferry wrote has no annotation to compare.
        w.spec["workload"]["manifests"].as_array_mut().unwrap().iter_mut().for_each(|m| m["metadata"]["annotations"] = json!({}));
        assert!(feedback_is_current(&w, &values(Some("tsk_1")), ns, "web"));
    }

    #[test]
    fn readiness_needs_a_finished_rollout() {
        let v = |pairs: &[(&str, i64)]| pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>();
        let all = [("ReadyReplicas", 2), ("Replicas", 2), ("AvailableReplicas", 2), ("updatedReplicas", 2), ("observedGeneration", 3), ("generation", 3)];
        assert!(readiness(&v(&all), 2).done);
        // The controller has not seen the new generation yet: old ready pods do not count.
        let mut stale = all;
        stale[4].1 = 2;
        assert!(!readiness(&v(&stale), 2).done);
        let mut partial = all;
        partial[0].1 = 1;
        let r = readiness(&v(&partial), 2);
        assert_eq!((r.ready, r.done), (1, false));
        assert!(!readiness(&BTreeMap::new(), 1).done);
    }
}
