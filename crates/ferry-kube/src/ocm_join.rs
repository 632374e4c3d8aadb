//! Joining a cluster to an OCM hub as `clusteradm join` and `clusteradm accept` do it, for
//! the create-cluster worker and the test bed's members alike.
//!
//! - The bootstrap identity (`clusteradm get token`, `pkg/helpers/client.go`
//!   `GetBootstrapTokenFromSA`): a one-hour TokenRequest for ServiceAccount
//!   `open-cluster-management/agent-registration-bootstrap`, which the cluster-manager chart
//!   binds to ClusterRole `open-cluster-management:bootstrap`
//!   (`deploy/cluster-manager/chart/cluster-manager/templates/bootstrap_*.yaml`): create
//!   ManagedClusters and CSRs, nothing else.
//! - The hub's address and CA: the hub's `kube-public/cluster-info` ConfigMap, as
//!   `clusteradm join` reads them (`createClientcmdapiv1Config`, sdk-go `GetCACert`);
//!   the address can be overridden (`--hub-apiserver`).
//! - On the managed cluster (the klusterlet chart, `deploy/klusterlet/chart/klusterlet`):
//!   namespace `open-cluster-management-agent`, Secret `bootstrap-hub-kubeconfig` (key
//!   `kubeconfig`), and the `Klusterlet` named `klusterlet` with the cluster's name; the
//!   klusterlet operator (installed as an add-on) runs the registration agent from it.
//! - Accepting (`pkg/cmd/accept/exec.go`): approve the CSRs labelled for the cluster whose
//!   requester is the bootstrap identity, refusing when they come from more than one agent
//!   (common name), then set `hubAcceptsClient`.
//!
//! The bootstrap kubeconfig carries a token: it goes from the hub straight into the
//! managed cluster's Secret and is never logged nor returned in an output.

use std::collections::BTreeSet;

use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

/// The hub namespace of the bootstrap identity (`clusteradm` `config.OpenClusterManagementNamespace`).
pub const HUB_NAMESPACE: &str = "open-cluster-management";
/// The bootstrap ServiceAccount (`config.BootstrapSAName`).
pub const BOOTSTRAP_SA: &str = "agent-registration-bootstrap";
/// The ClusterRole it is bound to.
pub const BOOTSTRAP_ROLE: &str = "open-cluster-management:bootstrap";
/// The agent's namespace on the managed cluster (`AgentNamespacePrefix + "agent"`).
pub const AGENT_NAMESPACE: &str = "open-cluster-management-agent";
/// The bootstrap kubeconfig Secret there (key `kubeconfig`).
pub const BOOTSTRAP_SECRET: &str = "bootstrap-hub-kubeconfig";
/// The hub kubeconfig Secret the agent writes once its certificate is issued.
pub const HUB_SECRET: &str = "hub-kubeconfig-secret";
/// The Klusterlet object (`DefaultOperatorName`).
pub const KLUSTERLET: &str = "klusterlet";
/// Label of a cluster's CSRs and hub objects (`clusterv1.ClusterNameLabelKey`).
pub const CLUSTER_NAME_LABEL: &str = "open-cluster-management.io/cluster-name";
/// The requester of bootstrap CSRs (`userNameSignatureSA`) and its group (`groupNameSA`).
pub const BOOTSTRAP_USER: &str = "system:serviceaccount:open-cluster-management:agent-registration-bootstrap";
const BOOTSTRAP_GROUP: &str = "system:serviceaccounts:open-cluster-management";
/// How long a bootstrap token lives (`clusteradm get token`: one hour).
const TOKEN_SECONDS: i64 = 3600;

/// Why a join or an accept could not go on.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    /// The hub refused or failed a call.
    #[error("{what} on the hub: {}", crate::said::said(source))]
    Hub {
        /// What was being done.
        what: &'static str,
        /// Cause.
        #[source]
        source: kube::Error,
    },
    /// The hub lacks what `clusteradm init` installs.
    #[error("the hub is not an OCM hub ready for joins: {0}")]
    NotAHub(String),
    /// The CSRs of a cluster come from several agents; approving them would give the
    /// cluster's identity to each (clusteradm skips the approval too).
    #[error("CSRs for cluster {cluster} come from different agents ({requesters}); none approved")]
    SeveralRequesters {
        /// The cluster.
        cluster: String,
        /// Their common names.
        requesters: String,
    },
}

fn hub(what: &'static str) -> impl FnOnce(kube::Error) -> JoinError {
    move |source| JoinError::Hub { what, source }
}

/// The hub's address and CA (base64 PEM) from `kube-public/cluster-info`.
async fn cluster_info(hub_client: &kube::Client) -> Result<(String, String), JoinError> {
    let cm = Api::<ConfigMap>::namespaced(hub_client.clone(), "kube-public")
        .get_opt("cluster-info")
        .await
        .map_err(hub("reading kube-public/cluster-info"))?
        .ok_or_else(|| JoinError::NotAHub("no ConfigMap kube-public/cluster-info".into()))?;
    let text = cm.data.and_then(|d| d.get("kubeconfig").cloned()).ok_or_else(|| JoinError::NotAHub("cluster-info has no kubeconfig".into()))?;
    let kc = kube::config::Kubeconfig::from_yaml(&text).map_err(|e| JoinError::NotAHub(format!("cluster-info's kubeconfig: {e}")))?;
    let cluster = kc.clusters.into_iter().next().and_then(|c| c.cluster).ok_or_else(|| JoinError::NotAHub("cluster-info names no cluster".into()))?;
    let server = cluster.server.ok_or_else(|| JoinError::NotAHub("cluster-info names no server".into()))?;
    let ca = cluster.certificate_authority_data.ok_or_else(|| JoinError::NotAHub("cluster-info has no CA data".into()))?;
    Ok((server, ca))
}

/// A bootstrap kubeconfig for a klusterlet (JSON, which kubeconfig loaders read): the hub
/// from cluster-info (or `server`), a fresh one-hour bootstrap token. Holds a secret.
pub async fn bootstrap_kubeconfig(hub_client: &kube::Client, server: Option<&str>) -> Result<String, JoinError> {
    let (info_server, ca) = cluster_info(hub_client).await?;
    let sas: Api<ServiceAccount> = Api::namespaced(hub_client.clone(), HUB_NAMESPACE);
    let request: TokenRequest = serde_json::from_value(json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {"expirationSeconds": TOKEN_SECONDS, "audiences": []}}))
    .expect("a TokenRequest");
    let token = sas
        .create_subresource::<TokenRequest, TokenRequest>("token", BOOTSTRAP_SA, &PostParams::default(), &request)
        .await
        .map_err(|e| match e {
            kube::Error::Api(s) if s.code == 404 => JoinError::NotAHub(format!("no ServiceAccount {HUB_NAMESPACE}/{BOOTSTRAP_SA} (run clusteradm init)")),
            e => JoinError::Hub { what: "requesting a bootstrap token", source: e },
        })?
        .status
        .map(|s| s.token)
        .unwrap_or_default();
    let server = server.map_or(info_server, str::to_owned);
    Ok(json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "hub", "cluster": {"server": server, "certificate-authority-data": ca}}],
        "users": [{"name": "bootstrap", "user": {"token": token}}],
        "contexts": [{"name": "bootstrap", "context": {"cluster": "hub", "user": "bootstrap"}}],
        "current-context": "bootstrap",
    })
    .to_string())
}

/// What `clusteradm join` leaves on the managed cluster for the klusterlet operator: the
/// agent namespace, the bootstrap Secret and the Klusterlet (default mode).
pub fn agent_objects(cluster: &str, bootstrap_kubeconfig: &str) -> Vec<Value> {
    vec![
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": AGENT_NAMESPACE}}),
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": BOOTSTRAP_SECRET, "namespace": AGENT_NAMESPACE},
               "type": "Opaque", "stringData": {"kubeconfig": bootstrap_kubeconfig}}),
        klusterlet(cluster),
    ]
}

/// The Klusterlet of `cluster` (`operator.open-cluster-management.io/v1`, default mode).
pub fn klusterlet(cluster: &str) -> Value {
    json!({"apiVersion": "operator.open-cluster-management.io/v1", "kind": "Klusterlet", "metadata": {"name": KLUSTERLET},
           "spec": {"clusterName": cluster, "namespace": AGENT_NAMESPACE, "deployOption": {"mode": "Singleton"}}})
}

/// Approves the pending bootstrap CSRs of `cluster` as `clusteradm accept` does; returns
/// whether one is approved (now or before).
pub async fn approve_csrs(hub_client: &kube::Client, cluster: &str) -> Result<bool, JoinError> {
    let api: Api<CertificateSigningRequest> = Api::all(hub_client.clone());
    let csrs = api.list(&ListParams::default().labels(&format!("{CLUSTER_NAME_LABEL}={cluster}"))).await.map_err(hub("listing CSRs"))?.items;
    let from_bootstrap: Vec<_> = csrs
        .into_iter()
        .filter(|c| c.spec.username.as_deref() == Some(BOOTSTRAP_USER) && c.spec.groups.iter().flatten().any(|g| g == BOOTSTRAP_GROUP))
        .collect();
    let requesters: BTreeSet<String> = from_bootstrap.iter().filter_map(|c| common_name(&c.spec.request.0)).collect();
    if requesters.len() > 1 {
        return Err(JoinError::SeveralRequesters { cluster: cluster.into(), requesters: requesters.into_iter().collect::<Vec<_>>().join(", ") });
    }
    let mut approved = false;
    for mut csr in from_bootstrap {
        let conds = csr.status.as_ref().and_then(|s| s.conditions.clone()).unwrap_or_default();
        if conds.iter().any(|c| c.type_ == "Denied") {
            continue;
        }
        if conds.iter().any(|c| c.type_ == "Approved") {
            approved = true;
            continue;
        }
        let Some(name) = csr.metadata.name.clone() else { continue };
        let status = csr.status.get_or_insert_with(Default::default);
        status.conditions.get_or_insert_with(Vec::new).push(
            serde_json::from_value(json!({"type": "Approved", "status": "True", "reason": "FerryApprove",
                "message": format!("Approved by Ferry's create-cluster for ManagedCluster {cluster}")}))
            .expect("a CSR condition"),
        );
        api.replace_subresource("approval", &name, &PostParams::default(), &csr).await.map_err(hub("approving a CSR"))?;
        approved = true;
    }
    Ok(approved)
}

/// The subject common name of a PEM certificate request.
fn common_name(pem: &[u8]) -> Option<String> {
    use x509_parser::prelude::FromDer;
    let (_, block) = x509_parser::pem::parse_x509_pem(pem).ok()?;
    let (_, req) = x509_parser::certification_request::X509CertificationRequest::from_der(&block.contents).ok()?;
    req.certification_request_info.subject.iter_common_name().next()?.as_str().ok().map(str::to_owned)
}

/// Accepts `cluster` (`hubAcceptsClient`) and gives it `labels` in the same write (a
/// cluster-set label needs `managedclustersets/join`, as the hub's webhook checks).
pub async fn accept(hub_client: &kube::Client, cluster: &str, labels: &Value) -> Result<(), JoinError> {
    let api: Api<crate::kinds::ManagedCluster> = Api::all(hub_client.clone());
    let patch = json!({"metadata": {"labels": labels}, "spec": {"hubAcceptsClient": true}});
    api.patch(cluster, &PatchParams::default(), &Patch::Merge(&patch)).await.map_err(hub("accepting the ManagedCluster"))?;
    Ok(())
}
