//! Emulated Liqo authentication on one member (liqotech/liqo
//! `pkg/liqo-controller-manager/authentication/`):
//!
//! - **Nonce creator** (`noncecreator-controller/noncecreator_controller.go`): a Secret
//!   labelled `liqo.io/nonce` and `liqo.io/remote-cluster-id`, in that cluster's tenant
//!   namespace (the one found by its labels, `pkg/tenantNamespace/namespaceManager.go`
//!   `GetNamespace`, whatever its name), gets a fresh nonce (64 random bytes, base64) in
//!   field `nonce`; one elsewhere is ignored (a Warning event says why).
//! - **Nonce signer** (`noncesigner-controller/noncesigner_controller.go`): a Secret
//!   labelled `liqo.io/signed-nonce` in the right tenant namespace gets field
//!   `signedNonce`: the nonce signed with the cluster's private key (`authentication-keys`).
//! - **Tenant controller** (`tenant-controller/tenant_controller.go`, `verifyHandshake`):
//!   unless `authzPolicy: TolerateNoHandshake`, the Tenant's signature must verify with its
//!   public key over the nonce this cluster issued for its cluster id, and its CSR must be
//!   for common name = its cluster id, organization `liqo.io`, and that same key
//!   (`csr.go`, `CheckCSRForControlPlane`); a failure leaves the status empty and records
//!   a Warning event (`NonceNotFound`, `SignatureVerificationFailed`, `InvalidCSR`) on the
//!   Tenant. On success the CSR is signed through the cluster's own certificates API
//!   (`pkg/identityManager/certificateIdentityProvider.go`, `ApproveSigningRequest`: a
//!   `kubernetes.io/kube-apiserver-client` CSR, approved; the controller manager signs
//!   it) and `status.authParams` carries the certificate, the cluster's CA and API server
//!   address, and `status.tenantNamespace` the namespace (`CreateNamespace`: the tenant
//!   namespace found by labels, else a new one under the default name). Then it binds
//!   the tenant's permissions (`pkg/tenantNamespace/bindings.go`): a RoleBinding
//!   `liqo-binding-liqo-remote-controlplane` in the tenant namespace giving the
//!   consumer's user (its cluster id, the CSR's common name) the ClusterRole Liqo's chart
//!   labels `app.kubernetes.io/name=remote-controlplane` (ResourceSlices, Renews,
//!   NamespaceMaps and their status), owned by the Tenant; and, with or without a
//!   handshake, a ClusterRoleBinding `liqo-binding-liqo-virtual-kubelet-remote-clusterwide-<id>`
//!   to the group of that name. Without those ClusterRoles it reconciles no Tenant
//!   (`ensureSetup`). A Tenant carries the finalizer `tenant.liqo.io/finalizer`; on
//!   deletion the cluster-wide binding goes first (`UnbindClusterRolesClusterWide`). The
//!   consumer's CRD replicator writes to the provider with the control-plane Identity's
//!   kubeconfig (`resources.rs`), so a peering works only through these bindings.
//! - **Identity controller** (`identity-controller/identity_controller.go`): an Identity
//!   gets a kubeconfig Secret `kubeconfig-<identity>` (the certificate of its auth params
//!   and this cluster's private key: a working credential toward the provider; a
//!   control-plane one annotated with the provider's tenant namespace, `spec.namespace`)
//!   and `status.kubeconfigSecretRef`.
//!
//! Not emulated: certificate renewal, cordoned and drained tenants.

use std::collections::BTreeMap;

use base64::Engine;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, RoleBinding};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use sha2::Digest;

use crate::emulate::finalizer_patch;
use super::{MANAGER, Member, ar, event, keys, name_of, ns_of, set_status, tenant_namespace_of};
use ferry_kube::vocab::liqo::{
    APP_NAME_LABEL, AUTH_KEYS_SECRET, CONTROL_PLANE_ORGANIZATION, REMOTE_CONTROLPLANE_APP, TENANT_ROLE_APPS, VK_REMOTE_CLUSTERWIDE_APP, LIQO_NAMESPACE, NONCE_FIELD, NONCE_LABEL, POD_SECURITY_LABELS, REMOTE_ID_LABEL, SIGNED_NONCE_FIELD,
    SIGNED_NONCE_LABEL, TENANT_NAMESPACE_LABEL, tenant_namespace,
};

/// Label of a kubeconfig Secret: the type of its Identity (`pkg/consts/authentication.go`,
/// `IdentityTypeLabelKey`).
pub(super) const IDENTITY_TYPE_LABEL: &str = "liqo.io/identity-type";
/// Annotation of a control-plane kubeconfig Secret: the provider's tenant namespace the
/// CRD replicator writes to (`pkg/consts/authentication.go`, `RemoteTenantNamespaceAnnotKey`).
pub(super) const REMOTE_TENANT_NAMESPACE_ANNOTATION: &str = "liqo.io/remote-tenant-namespace";

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// `consts.K8sAppManagedByKey`.
const APP_MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// `pkg/tenantNamespace/const.go`, `roleBindingRoot`.
const BINDING_ROOT: &str = "liqo-binding";
/// `tenant-controller/finalizer.go`, `tenantControllerFinalizer`.
const TENANT_FINALIZER: &str = "tenant.liqo.io/finalizer";

pub(super) fn auth(kind: &str, plural: &str) -> kube::api::ApiResource {
    ar("authentication.liqo.io", "v1beta1", kind, plural)
}

/// The cluster's private key PEM (`GetClusterKeys`).
pub(super) async fn private_key(client: &kube::Client) -> Result<Option<String>, kube::Error> {
    let s = Api::<Secret>::namespaced(client.clone(), LIQO_NAMESPACE).get_opt(AUTH_KEYS_SECRET).await?;
    Ok(s.and_then(|s| s.data?.get("privateKey").map(|k| String::from_utf8_lossy(&k.0).into_owned())))
}

/// Whether the nonce Secret `s` of `remote` is in this cluster's tenant namespace for it, as
/// the nonce creator and signer check (`noncecreator_controller.go` and
/// `noncesigner_controller.go`, `Reconcile`: the namespace `GetNamespace` finds by labels,
/// whatever its name; none or several is a `TenantNamespaceNotFound` Warning and a retry,
/// another one a `WrongNamespace` Warning and the Secret is left alone).
async fn in_tenant_namespace(client: &kube::Client, s: &Secret, remote: &str) -> Result<bool, kube::Error> {
    let found = tenant_namespace_of(client, remote).await?;
    let (reason, message) = match found {
        Ok(Some(ns)) if s.metadata.namespace.as_deref() == Some(ns.as_str()) => return Ok(true),
        Ok(Some(_)) => ("WrongNamespace", "Secret not in tenant namespace"),
        Ok(None) | Err(_) => ("TenantNamespaceNotFound", "Unable to get tenant namespace"),
    };
    let obj: DynamicObject = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Secret", "metadata": s.metadata})).expect("a Secret's metadata");
    event(client, &obj, "Warning", reason, message).await?;
    Ok(false)
}

fn label<'a>(s: &'a Secret, key: &str) -> Option<&'a str> {
    s.metadata.labels.as_ref()?.get(key).map(String::as_str)
}

/// The nonce creator and signer (`forged`: signing with another key than the cluster's).
pub(super) async fn nonces(m: &Member, forged: bool) -> Result<(), kube::Error> {
    let secrets: Api<Secret> = Api::all(m.client.clone());
    for s in secrets.list(&ListParams::default().labels(&format!("{NONCE_LABEL}=true"))).await?.items {
        let data = s.data.clone().unwrap_or_default();
        if data.get(NONCE_FIELD).is_some_and(|n| !n.0.is_empty()) {
            continue;
        }
        let Some(remote) = label(&s, REMOTE_ID_LABEL) else { continue };
        let ns = s.metadata.namespace.clone().unwrap_or_default();
        if !in_tenant_namespace(&m.client, &s, remote).await? {
            continue;
        }
        let Ok(nonce) = keys::nonce() else { continue };
        let api: Api<Secret> = Api::namespaced(m.client.clone(), &ns);
        api.patch(&s.metadata.name.clone().unwrap_or_default(), &PatchParams::default(), &Patch::Merge(&json!({"stringData": {NONCE_FIELD: nonce}}))).await?;
    }
    let Some(mut private) = private_key(&m.client).await? else { return Ok(()) };
    if forged {
        private = keys::generate().map_err(|e| kube::Error::Service(e.to_string().into()))?.0;
    }
    for s in secrets.list(&ListParams::default().labels(&format!("{SIGNED_NONCE_LABEL}=true"))).await?.items {
        let data = s.data.clone().unwrap_or_default();
        let Some(remote) = label(&s, REMOTE_ID_LABEL) else { continue };
        let ns = s.metadata.namespace.clone().unwrap_or_default();
        if data.contains_key(SIGNED_NONCE_FIELD) || !in_tenant_namespace(&m.client, &s, remote).await? {
            continue;
        }
        let Some(nonce) = data.get(NONCE_FIELD) else { continue };
        let Ok(sig) = keys::sign(&private, &nonce.0) else { continue };
        let api: Api<Secret> = Api::namespaced(m.client.clone(), &ns);
        api.patch(&s.metadata.name.clone().unwrap_or_default(), &PatchParams::default(), &Patch::Merge(&json!({"data": {SIGNED_NONCE_FIELD: B64.encode(sig)}})))
            .await?;
    }
    Ok(())
}

fn bytes(v: Option<&Value>) -> Vec<u8> {
    v.and_then(Value::as_str).and_then(|s| B64.decode(s).ok()).unwrap_or_default()
}

/// Verifies a Tenant's handshake (`verifyHandshake`): Ok, or the event's (reason, message).
async fn handshake(m: &Member, t: &DynamicObject, consumer: &str) -> Result<Result<(), (&'static str, String)>, kube::Error> {
    let secrets: Api<Secret> = Api::all(m.client.clone());
    let lp = ListParams::default().labels(&format!("{NONCE_LABEL}=true,{REMOTE_ID_LABEL}={consumer}"));
    let nonce = secrets.list(&lp).await?.items.into_iter().find_map(|s| s.data?.get(NONCE_FIELD).map(|n| n.0.clone()).filter(|n| !n.is_empty()));
    let Some(nonce) = nonce else {
        return Ok(Err(("NonceNotFound", format!("unable to get the nonce for the Tenant {:?}: nonce not found", name_of(t)))));
    };
    let public = bytes(t.data.pointer("/spec/publicKey"));
    let der = match keys::public_key_der(&public) {
        Ok(d) => d,
        Err(e) => return Ok(Err(("SignatureVerificationFailed", format!("failed to parse public key in Tenant resource {:?}: {e}", name_of(t))))),
    };
    if keys::verify(&public, &nonce, &bytes(t.data.pointer("/spec/signature"))).is_err() {
        return Ok(Err(("SignatureVerificationFailed", format!("signature verification failed for Tenant {:?}", name_of(t)))));
    }
    if let Err(e) = keys::check_csr(&bytes(t.data.pointer("/spec/csr")), consumer, CONTROL_PLANE_ORGANIZATION, Some(&der)) {
        return Ok(Err(("InvalidCSR", e.to_string())));
    }
    Ok(Ok(()))
}

/// Signs `csr_pem` through the cluster's certificates API; the certificate once issued.
pub(super) async fn issue(m: &Member, csr_pem: &[u8]) -> Result<Option<Vec<u8>>, kube::Error> {
    let api: Api<CertificateSigningRequest> = Api::all(m.client.clone());
    let digest = sha2::Sha256::digest(csr_pem);
    let name = format!("liqo-identity-{}", digest[..8].iter().map(|b| format!("{b:02x}")).collect::<String>());
    let csr = match api.get_opt(&name).await? {
        Some(c) => c,
        None => {
            let obj: CertificateSigningRequest = serde_json::from_value(json!({"apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
                "metadata": {"name": name, "labels": {"liqo.io/remote-tenant-csr": "true"}},
                "spec": {"groups": ["system:authenticated"], "signerName": "kubernetes.io/kube-apiserver-client", "request": B64.encode(csr_pem),
                         "usages": ["digital signature", "key encipherment", "client auth"]}}))
            .expect("a CSR");
            api.create(&PostParams::default(), &obj).await?
        }
    };
    let conds = csr.status.as_ref().and_then(|s| s.conditions.clone()).unwrap_or_default();
    if !conds.iter().any(|c| c.type_ == "Approved") {
        let mut csr = csr;
        csr.status.get_or_insert_with(Default::default).conditions.get_or_insert_with(Vec::new).push(
            serde_json::from_value(json!({"type": "Approved", "status": "True", "reason": "IdentityManagerApproval", "message": "This CSR was approved by Liqo Identity Manager"}))
                .expect("a CSR condition"),
        );
        api.replace_subresource("approval", &name, &PostParams::default(), &csr).await?;
        return Ok(None);
    }
    Ok(csr.status.and_then(|s| s.certificate).map(|c| c.0).filter(|c| !c.is_empty()))
}

/// The tenant controller.
pub(super) async fn tenants(m: &Member) -> Result<(), kube::Error> {
    // `ensureSetup`: no Tenant is reconciled until the chart's tenant ClusterRoles are
    // there; each list is looked up until found, then kept for the controller's life.
    let roles: Api<ClusterRole> = Api::all(m.client.clone());
    let mut bound = m.tenant_roles.lock().expect("tenant roles lock").clone();
    for (app, names) in TENANT_ROLE_APPS.iter().zip(bound.iter_mut()) {
        if names.is_empty() {
            *names = roles.list(&ListParams::default().labels(&format!("{APP_NAME_LABEL}={app}"))).await?.items.into_iter().filter_map(|r| r.metadata.name).collect();
        }
        if names.is_empty() {
            tracing::debug!(cluster = %m.name, app, "emulated Liqo: required ClusterRoles not found; no Tenant reconciled");
            return Ok(());
        }
    }
    m.tenant_roles.lock().expect("tenant roles lock").clone_from(&bound);
    let [namespaced, cluster_wide] = &bound;
    let all: Api<DynamicObject> = Api::all_with(m.client.clone(), &auth("Tenant", "tenants"));
    for t in all.list(&ListParams::default()).await?.items {
        let consumer = t.data.pointer("/spec/clusterID").and_then(Value::as_str).map(str::to_owned);
        let api: Api<DynamicObject> = Api::namespaced_with(m.client.clone(), &ns_of(&t), &auth("Tenant", "tenants"));
        let finalizers = t.metadata.finalizers.clone().unwrap_or_default();
        if t.metadata.deletion_timestamp.is_some() {
            if finalizers.iter().any(|f| f == TENANT_FINALIZER) {
                for role in cluster_wide.iter().filter(|_| consumer.is_some()) {
                    let name = cluster_binding_name(role, consumer.as_deref().unwrap_or_default());
                    crate::emulate::absent(Api::<ClusterRoleBinding>::all(m.client.clone()).delete(&name, &DeleteParams::default()).await)?;
                }
                if let Some(patch) = finalizer_patch(&t.metadata, TENANT_FINALIZER, false) {
                    api.patch(&name_of(&t), &PatchParams::default(), &Patch::Merge(&patch)).await?;
                }
            }
            continue;
        }
        let Some(consumer) = consumer else { continue };
        if let Some(patch) = finalizer_patch(&t.metadata, TENANT_FINALIZER, true) {
            api.patch(&name_of(&t), &PatchParams::default(), &Patch::Merge(&patch)).await?;
        }
        let tolerate = t.data.pointer("/spec/authzPolicy").and_then(Value::as_str) == Some("TolerateNoHandshake");
        if let Some(ns) = t.data.pointer("/status/tenantNamespace").and_then(Value::as_str).filter(|_| tolerate || t.data.pointer("/status/authParams/signedCRT").is_some()) {
            bind(m, &t, &consumer, ns, if tolerate { &[] } else { namespaced }, cluster_wide).await?;
            continue;
        }
        if !tolerate && let Err((reason, message)) = handshake(m, &t, &consumer).await? {
            event(&m.client, &t, "Warning", reason, &message).await?;
            continue;
        }
        // `CreateNamespace` (`pkg/tenantNamespace/namespaceManager.go`): the tenant namespace
        // `GetNamespace` finds by labels, whatever its name; only when there is none, one
        // created under the default name with `ForgeNamespace`'s labels (a plain create: a
        // namespace of that name without the labels makes it fail). Any error is a
        // `TenantNamespaceCreationFailed` Warning on the Tenant and a retry
        // (`tenant_controller.go`, `Reconcile`).
        let ns = match tenant_namespace_of(&m.client, &consumer).await? {
            Ok(Some(ns)) => ns,
            Ok(None) => {
                let ns = tenant_namespace(&consumer);
                let mut labels = serde_json::Map::new();
                labels.insert(REMOTE_ID_LABEL.into(), json!(consumer));
                labels.insert(TENANT_NAMESPACE_LABEL.into(), json!("true"));
                for l in POD_SECURITY_LABELS {
                    labels.insert(l.into(), json!("privileged"));
                }
                let obj: Namespace = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": labels}})).expect("a Namespace");
                match Api::<Namespace>::all(m.client.clone()).create(&PostParams::default(), &obj).await {
                    Ok(_) => ns,
                    Err(kube::Error::Api(e)) => {
                        event(&m.client, &t, "Warning", "TenantNamespaceCreationFailed", &e.message).await?;
                        continue;
                    }
                    Err(e) => return Err(e),
                }
            }
            Err(why) => {
                event(&m.client, &t, "Warning", "TenantNamespaceCreationFailed", &why).await?;
                continue;
            }
        };
        let mut status = json!({"tenantNamespace": ns});
        if !tolerate {
            let Some(cert) = issue(m, &bytes(t.data.pointer("/spec/csr"))).await? else { continue };
            status["authParams"] = json!({"signedCRT": B64.encode(cert), "ca": B64.encode(&m.ca_pem), "apiServer": m.server});
        }
        set_status(&api, &name_of(&t), status).await?;
        bind(m, &t, &consumer, &ns, if tolerate { &[] } else { namespaced }, cluster_wide).await?;
    }
    Ok(())
}

/// `BindClusterRoles` (with a handshake: `namespaced`, in the tenant namespace `ns`, to
/// the consumer's user, owned by the Tenant) and `BindClusterRolesClusterWide` (to the
/// consumer's group, no owner); each is created, and one already there is left as it is
/// (upstream's `Create`, then `Get` on `AlreadyExists`).
async fn bind(m: &Member, t: &DynamicObject, consumer: &str, ns: &str, namespaced: &[String], cluster_wide: &[String]) -> Result<(), kube::Error> {
    let labels = json!({APP_MANAGED_BY_LABEL: "liqo", REMOTE_ID_LABEL: consumer});
    let role_ref = |role: &str| json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role});
    let bindings: Api<RoleBinding> = Api::namespaced(m.client.clone(), ns);
    for role in namespaced {
        let name = format!("{BINDING_ROOT}-{role}");
        let rb: RoleBinding = serde_json::from_value(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": name, "namespace": ns, "labels": labels,
                "ownerReferences": [{"apiVersion": "authentication.liqo.io/v1beta1", "kind": "Tenant", "name": name_of(t), "uid": t.metadata.uid.clone().unwrap_or_default(), "controller": true, "blockOwnerDeletion": true}]},
            "subjects": [{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": consumer}], "roleRef": role_ref(role)}))
        .expect("a RoleBinding");
        crate::emulate::present(bindings.create(&PostParams::default(), &rb).await)?;
    }
    let cluster_bindings: Api<ClusterRoleBinding> = Api::all(m.client.clone());
    for role in cluster_wide {
        let name = cluster_binding_name(role, consumer);
        let crb: ClusterRoleBinding = serde_json::from_value(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": name, "labels": labels},
            "subjects": [{"kind": "Group", "apiGroup": "rbac.authorization.k8s.io", "name": consumer}], "roleRef": role_ref(role)}))
        .expect("a ClusterRoleBinding");
        crate::emulate::present(cluster_bindings.create(&PostParams::default(), &crb).await)?;
    }
    Ok(())
}

/// `getClusterRoleBindingName`: the cluster-wide binding of `role` for `consumer`.
fn cluster_binding_name(role: &str, consumer: &str) -> String {
    format!("{BINDING_ROOT}-{role}-{consumer}")
}

/// The ClusterRoles Liqo's chart installs for tenants (`deployments/liqo/templates/
/// liqo-controlplane-rbac.yaml` with `files/liqo-remote-controlplane-ClusterRole.yaml`;
/// `liqo-controller-manager-rbac.yaml` with
/// `files/liqo-virtual-kubelet-remote-clusterwide-ClusterRole.yaml`), labelled as the
/// chart's `liqo.labels` so the tenant controller finds them.
pub(super) fn tenant_cluster_roles() -> Vec<ClusterRole> {
    let all = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"];
    let labels = |app: &str, component: &str| json!({APP_NAME_LABEL: app, "app.kubernetes.io/component": component, "app.kubernetes.io/part-of": "liqo"});
    [
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": format!("liqo-{REMOTE_CONTROLPLANE_APP}"), "labels": labels(REMOTE_CONTROLPLANE_APP, "authentication")},
            "rules": [{"apiGroups": ["authentication.liqo.io"], "resources": ["renews", "renews/status", "resourceslices", "resourceslices/status"], "verbs": all},
                      {"apiGroups": ["offloading.liqo.io"], "resources": ["namespacemaps", "namespacemaps/status"], "verbs": all}]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": format!("liqo-{VK_REMOTE_CLUSTERWIDE_APP}"), "labels": labels(VK_REMOTE_CLUSTERWIDE_APP, "virtualkubelet")},
            "rules": [{"apiGroups": ["metrics.liqo.io"], "resources": ["scrape/metrics"], "verbs": ["get", "list", "watch"]}]}),
    ]
    .into_iter()
    .map(|r| serde_json::from_value(r).expect("a ClusterRole"))
    .collect()
}

/// The ClusterRole Liqo's NamespaceMap controller binds in each remote namespace it makes
/// for a consumer's virtual kubelet (`pkg/consts/namespace_mapping.go`,
/// `RemoteNamespaceClusterRoleName`; the chart's `liqo-virtual-kubelet-remote`,
/// `deployments/liqo/files/liqo-virtual-kubelet-remote-ClusterRole.yaml`: the kinds a
/// virtual kubelet reflects, and ShadowPods rather than Pods).
pub(super) fn virtual_kubelet_remote_role() -> ClusterRole {
    let all = ["create", "delete", "get", "list", "patch", "update", "watch"];
    serde_json::from_value(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": VK_REMOTE_ROLE, "labels": {APP_NAME_LABEL: "virtual-kubelet-remote", "app.kubernetes.io/component": "virtualkubelet", "app.kubernetes.io/part-of": "liqo"}},
        "rules": [{"apiGroups": [""], "resources": ["configmaps", "events", "persistentvolumeclaims", "secrets", "services"], "verbs": all},
                  {"apiGroups": [""], "resources": ["pods/attach", "pods/exec"], "verbs": ["create"]},
                  {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get", "list"]},
                  {"apiGroups": [""], "resources": ["pods/portforward"], "verbs": ["create", "get"]},
                  {"apiGroups": ["", "metrics.k8s.io"], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
                  {"apiGroups": ["networking.k8s.io"], "resources": ["ingresses"], "verbs": all},
                  {"apiGroups": ["offloading.liqo.io"], "resources": ["shadowendpointslices", "shadowpods"], "verbs": all}]}))
    .expect("a ClusterRole")
}

/// See [`virtual_kubelet_remote_role`].
pub const VK_REMOTE_ROLE: &str = "liqo-virtual-kubelet-remote";

/// A kubeconfig for `server` (CA `ca`) with client certificate `cert` and key `key`.
fn kubeconfig(server: &str, ca: &[u8], cert: &[u8], key: &[u8]) -> String {
    let doc = json!({"apiVersion": "v1", "kind": "Config", "current-context": "liqo",
        "clusters": [{"name": "remote", "cluster": {"server": server, "certificate-authority-data": B64.encode(ca)}}],
        "users": [{"name": "liqo", "user": {"client-certificate-data": B64.encode(cert), "client-key-data": B64.encode(key)}}],
        "contexts": [{"name": "liqo", "context": {"cluster": "remote", "user": "liqo"}}]});
    doc.to_string()
}

/// The identity controller.
pub(super) async fn identities(m: &Member) -> Result<(), kube::Error> {
    let all: Api<DynamicObject> = Api::all_with(m.client.clone(), &auth("Identity", "identities"));
    let Some(private) = private_key(&m.client).await? else { return Ok(()) };
    for id in all.list(&ListParams::default()).await?.items {
        if id.metadata.deletion_timestamp.is_some() || id.data.pointer("/status/kubeconfigSecretRef/name").is_some() {
            continue;
        }
        let cert = bytes(id.data.pointer("/spec/authParams/signedCRT"));
        let Some(server) = id.data.pointer("/spec/authParams/apiServer").and_then(Value::as_str) else { continue };
        if cert.is_empty() {
            continue;
        }
        let ns = ns_of(&id);
        let name = format!("kubeconfig-{}", name_of(&id));
        let remote = id.data.pointer("/spec/clusterID").and_then(Value::as_str).unwrap_or_default();
        let type_ = id.data.pointer("/spec/type").and_then(Value::as_str).unwrap_or("");
        let config = kubeconfig(server, &bytes(id.data.pointer("/spec/authParams/ca")), &cert, private.as_bytes());
        // `forge/kubeconfig.go`, `MutateKubeconfigSecret`: a control-plane Identity's
        // `spec.namespace` (the provider's tenant namespace for us), when set, goes to the
        // annotation the CRD replicator reads (`identity_controller.go`, `ensureKubeconfigSecret`).
        let mut annotations = serde_json::Map::new();
        if type_ == "ControlPlane"
            && let Some(remote_ns) = id.data.pointer("/spec/namespace").and_then(Value::as_str).filter(|n| !n.is_empty())
        {
            annotations.insert(REMOTE_TENANT_NAMESPACE_ANNOTATION.into(), json!(remote_ns));
        }
        let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": ns,
            "labels": {REMOTE_ID_LABEL: remote, IDENTITY_TYPE_LABEL: type_}, "annotations": annotations,
            "ownerReferences": [{"apiVersion": "authentication.liqo.io/v1beta1", "kind": "Identity", "name": name_of(&id), "uid": id.metadata.uid.clone().unwrap_or_default(), "controller": true}]},
            "data": {"kubeconfig": B64.encode(config)}});
        Api::<Secret>::namespaced(m.client.clone(), &ns).patch(&name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(&secret)).await?;
        let api: Api<DynamicObject> = Api::namespaced_with(m.client.clone(), &ns, &auth("Identity", "identities"));
        set_status(&api, &name_of(&id), json!({"kubeconfigSecretRef": {"name": name}})).await?;
    }
    Ok(())
}

/// Remote cluster ids this cluster has a control-plane Identity with a kubeconfig for.
pub(super) async fn authenticated_toward(m: &Member) -> Result<BTreeMap<String, String>, kube::Error> {
    let all: Api<DynamicObject> = Api::all_with(m.client.clone(), &auth("Identity", "identities"));
    Ok(all
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|i| i.data.pointer("/spec/type").and_then(Value::as_str) == Some("ControlPlane"))
        .filter_map(|i| {
            let secret = i.data.pointer("/status/kubeconfigSecretRef/name").and_then(Value::as_str)?.to_owned();
            Some((i.data.pointer("/spec/clusterID").and_then(Value::as_str)?.to_owned(), secret))
        })
        .collect())
}
