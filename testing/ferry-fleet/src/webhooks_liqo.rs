//! Liqo's Tenant admission webhook on a member, as the chart installs it (liqotech/liqo
//! `deployments/liqo/templates/webhooks/liqo-validating-webhook.yaml`, webhook
//! `tenant.validate.liqo.io`, CREATE and UPDATE of `tenants`; logic in
//! `pkg/webhooks/tenant/validate.go`): a Tenant must sit in a tenant namespace (label
//! `liqo.io/tenant-namespace=true`), carry a `liqo.io/remote-cluster-id` label equal to
//! its `spec.clusterID`, and have the cluster id of its namespace; on create it must be
//! the only Tenant of its namespace and its name unique in the cluster; on update no
//! other Tenant may have its name. The messages are upstream's.
//!
//! Each member gets its own webhook server (the validator reads that member's namespaces
//! and Tenants).

use std::sync::Arc;

use futures::FutureExt;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DynamicObject, ListParams};
use kube::core::admission::{AdmissionRequest, Operation};
use serde_json::Value;

use crate::admission::{Registration, Requirement, Selector, Validator};
use ferry_kube::vocab::liqo::{REMOTE_ID_LABEL, TENANT_NAMESPACE_LABEL};

/// The Tenant webhook's registration, as upstream's manifest has it.
pub const TENANT: Registration = Registration {
    name: "tenant.validate.liqo.io",
    groups: &["authentication.liqo.io"],
    versions: &["v1beta1"],
    resources: &["tenants"],
    operations: &["CREATE", "UPDATE"],
    namespace_selector: None,
    // Upstream skips objects labelled `liqo.io/webhook-skip=true`.
    object_selector: Some(Selector { match_labels: &[], match_expressions: &[Requirement { key: "liqo.io/webhook-skip", operator: "NotIn", values: &["true"] }] }),
};

/// The Liqo webhooks of the member `client` reaches.
pub fn validators(client: kube::Client) -> Vec<(Registration, Arc<dyn Validator>)> {
    vec![(TENANT, Arc::new(TenantWebhook { client }))]
}

struct TenantWebhook {
    client: kube::Client,
}

fn tenants(client: &kube::Client, ns: Option<&str>) -> Api<DynamicObject> {
    let r = kube::api::ApiResource::from_gvk_with_plural(&kube::api::GroupVersionKind::gvk("authentication.liqo.io", "v1beta1", "Tenant"), "tenants");
    match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &r),
        None => Api::all_with(client.clone(), &r),
    }
}

impl TenantWebhook {
    /// `tenantConsistencyChecks`.
    async fn consistent(&self, t: &DynamicObject) -> Result<(), String> {
        let ns_name = t.metadata.namespace.clone().unwrap_or_default();
        let ns = Api::<Namespace>::all(self.client.clone()).get(&ns_name).await.map_err(|e| format!("failed getting the tenant namespace: {e}"))?;
        let labels = ns.metadata.labels.unwrap_or_default();
        if labels.get(TENANT_NAMESPACE_LABEL).map(String::as_str) != Some("true") {
            return Err("resources Tenant must be created in a tenant namespace, check the documentation for further info".into());
        }
        let cluster_id = t.data.pointer("/spec/clusterID").and_then(Value::as_str).unwrap_or_default();
        let label = t.metadata.labels.as_ref().and_then(|l| l.get(REMOTE_ID_LABEL)).map(String::as_str).unwrap_or_default();
        if label != cluster_id {
            return Err(format!("the {REMOTE_ID_LABEL:?} label must match the cluster ID in the specs"));
        }
        if labels.get(REMOTE_ID_LABEL).map(String::as_str).unwrap_or_default() != cluster_id {
            return Err("the Tenant must have the same cluster ID of its tenant namespace".into());
        }
        Ok(())
    }

    async fn decide(&self, req: &AdmissionRequest<DynamicObject>) -> Result<(), String> {
        let Some(t) = req.object.as_ref() else { return Ok(()) };
        self.consistent(t).await?;
        let name = t.metadata.name.clone().unwrap_or_default();
        let same_name = tenants(&self.client, None)
            .list(&ListParams::default().fields(&format!("metadata.name={name}")))
            .await
            .map_err(|_| "failed getting Tenants in cluster".to_owned())?
            .items;
        match req.operation {
            Operation::Create => {
                let ns = t.metadata.namespace.clone().unwrap_or_default();
                let here = tenants(&self.client, Some(&ns)).list(&ListParams::default()).await.map_err(|_| "failed getting Tenants in tenant namespace".to_owned())?.items;
                if !here.is_empty() {
                    return Err("a Tenant already exists in the tenant namespace".into());
                }
                if !same_name.is_empty() {
                    return Err("tenant should have a unique name across the cluster: a Tenant with the same name already exists in the cluster".into());
                }
            }
            Operation::Update if same_name.len() == 1 && same_name[0].metadata.uid != t.metadata.uid => {
                return Err("tenant should have a unique name across the cluster: a Tenant with the same name already exists in the cluster".into());
            }
            _ => {}
        }
        Ok(())
    }
}

impl Validator for TenantWebhook {
    fn validate<'a>(&'a self, req: &'a AdmissionRequest<DynamicObject>) -> BoxFuture<'a, Result<(), String>> {
        self.decide(req).boxed()
    }
}
