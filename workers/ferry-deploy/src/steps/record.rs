//! The app record: ConfigMap `ferry-app-<name>` on the hub, in the app's namespace, with
//! the [`AppState`] the fleet holds. `check` reads it (the previous app, which every undo
//! converges back to); converging writes it, or deletes it when the app goes.

use ferry_kube::step_errors::hub_err;
use ferry_task::{StepError, codes};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::json;

use crate::handler::Inner;
use crate::render::{self, APP_LABEL, AppState, MANAGER, OWNER_LABEL, TASK_ANNOTATION};
use crate::spec::DeployApp;

/// Key of the app record's ConfigMap holding the [`AppState`] as JSON.
pub const STATE_KEY: &str = "state.json";

/// Name of the app record on the hub (a ConfigMap in the app's namespace).
pub fn record_name(app: &str) -> String {
    format!("ferry-app-{app}")
}

impl Inner {
    pub(super) async fn read_state(&self, app: &DeployApp) -> Result<Option<AppState>, StepError> {
        let cms: Api<ConfigMap> = Api::namespaced(self.hub(), app.namespace());
        let Some(cm) = cms.get_opt(&record_name(&app.name)).await.map_err(hub_err)? else { return Ok(None) };
        let text = cm.data.and_then(|mut d| d.remove(STATE_KEY)).unwrap_or_default();
        serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| StepError::permanent(codes::BAD_APP_RECORD, format!("ConfigMap {}/{} on the hub: {e}", app.namespace(), record_name(&app.name))))
    }

    pub(super) async fn write_state(&self, app: &DeployApp, state: Option<&AppState>, task: &str) -> Result<(), StepError> {
        let cms: Api<ConfigMap> = Api::namespaced(self.hub(), app.namespace());
        let name = record_name(&app.name);
        match state {
            Some(s) => {
                let cm = json!({
                    "apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": name, "namespace": app.namespace(),
                        "labels": {"app.kubernetes.io/managed-by": "ferry", APP_LABEL: app.name, OWNER_LABEL: render::owner_label(&s.spec.owner)},
                        "annotations": {TASK_ANNOTATION: task}},
                    "data": {STATE_KEY: serde_json::to_string(s).expect("serializable")},
                });
                cms.patch(&name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(&cm)).await.map_err(hub_err)?;
            }
            None => match cms.delete(&name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(hub_err(e)),
            },
        }
        Ok(())
    }
}
