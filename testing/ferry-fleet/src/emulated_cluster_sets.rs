//! The registration hub's two ManagedClusterSet controllers (open-cluster-management-io/ocm
//! `pkg/registration/hub/managedclusterset/default_managedclusterset_controller.go` and
//! `global_managedclusterset_controller.go`; feature gate `DefaultClusterSet`, on by
//! default): `default` (selected by the exclusive clusterset label, which the hub's
//! mutating webhook puts on every cluster without one, `crate::webhooks_ocm`) and `global`
//! (an empty label selector: every cluster) are made when missing, and their selector is
//! put back when someone changes it, unless the set is annotated
//! `cluster.open-cluster-management.io/autoupdate: "false"`.

use ferry_kube::kinds::ManagedClusterSet;
use kube::api::{Api, DynamicObject, PostParams};
use kube::core::ApiResource;
use serde_json::{Value, json};

/// The annotation that stops the controllers from putting a set's selector back.
pub const AUTO_UPDATE: &str = "cluster.open-cluster-management.io/autoupdate";
/// The `global` set's name (`GlobalManagedClusterSetName`).
pub const GLOBAL: &str = "global";
/// The `default` set's name (`DefaultManagedClusterSetName`).
pub use ferry_kube::vocab::ocm::DEFAULT_CLUSTER_SET as DEFAULT;

/// The selector each set must have (`DefaultManagedClusterSet`, `GlobalManagedClusterSet`).
fn selector(name: &str) -> Value {
    if name == GLOBAL {
        json!({"selectorType": "LabelSelector", "labelSelector": {}})
    } else {
        json!({"selectorType": "ExclusiveClusterSetLabel"})
    }
}

/// One pass of both controllers over the hub.
pub async fn tick(hub: &kube::Client) -> Result<(), kube::Error> {
    // Untyped: the typed kind writes no apiVersion and kind, which a create needs.
    let ar = ApiResource::erase::<ManagedClusterSet>(&());
    let api: Api<DynamicObject> = Api::all_with(hub.clone(), &ar);
    for name in [DEFAULT, GLOBAL] {
        let Some(mut set) = api.get_opt(name).await? else {
            let made = DynamicObject::new(name, &ar).data(json!({"spec": {"clusterSelector": selector(name)}}));
            // Made by someone else since the read: the next pass looks at it.
            crate::emulate::present(api.create(&PostParams::default(), &made).await)?;
            continue;
        };
        if set.metadata.annotations.as_ref().and_then(|a| a.get(AUTO_UPDATE)).is_some_and(|v| v == "false") {
            continue;
        }
        // equality.Semantic.DeepEqual of the selectors; an Update at the version read.
        if set.data.pointer("/spec/clusterSelector") != Some(&selector(name)) {
            set.data["spec"]["clusterSelector"] = selector(name);
            api.replace(name, &PostParams::default(), &set).await?;
        }
    }
    Ok(())
}
