//! The app record: ConfigMap `ferry-app-<name>` on the hub, in the app's namespace, with
//! the [`AppState`] the fleet holds. `check` reads it (the previous app, which every undo
//! converges back to); converging writes it, or deletes it when the app goes. A
//! ConfigMap of that name that Ferry did not write for the app is left alone.

use ferry_kube::HUB;
use ferry_kube::step_errors::hub_err;
use ferry_task::{StepError, codes};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::json;

use crate::handler::Inner;
use crate::ownership::{self, NotFerrys};
use crate::render::{self, APP_LABEL, AppState, MANAGER, OWNER_LABEL, TASK_ANNOTATION};
use crate::spec::DeployApp;

/// Key of the app record's ConfigMap holding the [`AppState`] as JSON.
pub const STATE_KEY: &str = "state.json";

/// Name of the app record on the hub (a ConfigMap in the app's namespace).
pub fn record_name(app: &str) -> String {
    format!("ferry-app-{app}")
}

fn not_ferrys(app: &DeployApp, cm: &ConfigMap) -> NotFerrys {
    let what = ownership::describe("ConfigMap", Some(app.namespace()), &record_name(&app.name));
    NotFerrys::Foreign { cluster: HUB.to_owned(), what, app: app.name.clone(), by: ownership::managed_by(&cm.metadata) }
}

impl Inner {
    /// The app as the fleet holds it (`check` reads it: a record of the name that Ferry
    /// did not write rejects the command).
    pub(super) async fn read_state(&self, app: &DeployApp) -> Result<Option<AppState>, StepError> {
        let cms: Api<ConfigMap> = Api::namespaced(self.hub(), app.namespace());
        let Some(cm) = cms.get_opt(&record_name(&app.name)).await.map_err(hub_err)? else { return Ok(None) };
        if !ownership::is_ferrys(&cm.metadata, &app.name) {
            return Err(StepError::rejected(codes::OBJECT_NOT_FERRYS, not_ferrys(app, &cm).to_string()));
        }
        let text = cm.data.and_then(|mut d| d.remove(STATE_KEY)).unwrap_or_default();
        serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| StepError::permanent(codes::BAD_APP_RECORD, format!("ConfigMap {}/{} on the hub: {e}", app.namespace(), record_name(&app.name))))
    }

    /// Records `state` (None: removes the record), never over or instead of a ConfigMap
    /// Ferry did not write.
    pub(super) async fn write_state(&self, app: &DeployApp, state: Option<&AppState>, task: &str) -> Result<(), StepError> {
        let cms: Api<ConfigMap> = Api::namespaced(self.hub(), app.namespace());
        let name = record_name(&app.name);
        let live = cms.get_opt(&name).await.map_err(hub_err)?;
        if let Some(cm) = &live
            && !ownership::is_ferrys(&cm.metadata, &app.name)
        {
            return match state {
                Some(_) => Err(not_ferrys(app, cm).into()),
                None => Ok(()),
            };
        }
        match state {
            Some(s) => {
                let cm = json!({
                    "apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": name, "namespace": app.namespace(),
                        "labels": {ownership::MANAGED_BY: ownership::FERRY, APP_LABEL: app.name, OWNER_LABEL: render::owner_label(&s.spec.owner)},
                        "annotations": {TASK_ANNOTATION: task}},
                    "data": {STATE_KEY: serde_json::to_string(s).expect("serializable")},
                });
                match cms.patch(&name, &PatchParams::apply(MANAGER), &Patch::Apply(&cm)).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 409 => {
                        return Err(NotFerrys::conflict(HUB, "ConfigMap", ownership::describe("ConfigMap", Some(app.namespace()), &name), &s.message).into());
                    }
                    Err(e) => return Err(hub_err(e)),
                }
            }
            None if live.is_none() => {}
            None => match cms.delete(&name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(hub_err(e)),
            },
        }
        Ok(())
    }
}
