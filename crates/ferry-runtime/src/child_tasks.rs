//! [`Children`] over Kafka, for the `plan` kind: a child's Start, Cancel and Revert go to its kind's command
//! topic through a [`Client`] (keyed, `requested_by` = `plan/<parent>`), and its snapshots
//! are read and waited for in the client's live view of every task-state topic (one
//! consumer for the process, whatever the number of plans waiting).
//!
//! The runtime does not know the kinds' spec types (they live in the worker crates): a
//! child's JSON spec is encoded by its kind's registration ([`encode_registered`], every
//! kind the program links), or by whatever [`SpecEncoder`] builds the plan worker.

use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use serde_json::Value;

use crate::children::{ChildCommand, ChildError, Children};
use crate::client::{Client, ClientError, SubmitOptions};
use crate::ids::TaskId;
use crate::kind::TaskKind;
use crate::live::{LiveError, LiveState};
use crate::protocol::{CommandAction, CommandEnvelope, TaskSnapshot};
use crate::wire::Registry;

/// A child's spec encoded as its kind's record, with the subject the kind derives from it.
#[derive(Debug, Clone)]
pub struct EncodedSpec {
    /// Confluent-framed Avro of the kind's spec record.
    pub bytes: Vec<u8>,
    /// The subject the kind derives from the spec, for kinds that derive one.
    pub subject: Option<String>,
}

/// Encodes a child's JSON spec as its kind's record (the reason names the field on error).
pub type SpecEncoder = Arc<dyn Fn(&Registry, TaskKind, &Value) -> Result<EncodedSpec, String> + Send + Sync>;

/// How long reading the task-state topics to their ends may take.
const READ_LIMIT: Duration = Duration::from_secs(60);

/// The encoder of every kind this program registers (`KindInfo::encode` and
/// `KindInfo::subject_of`).
pub fn encode_registered(registry: &Registry, kind: TaskKind, spec: &Value) -> Result<EncodedSpec, String> {
    let info = crate::kind::info(kind).ok_or_else(|| format!("this worker cannot encode {kind} specs: no crate in it registers the kind"))?;
    Ok(EncodedSpec { bytes: (info.encode)(registry, spec.clone())?, subject: (info.subject_of)(spec) })
}

/// [`Children`] through a [`Client`] and its live view.
pub struct KafkaChildren {
    client: Client,
    live: LiveState,
    encode: SpecEncoder,
}

impl std::fmt::Debug for KafkaChildren {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaChildren").field("client", &self.client).finish()
    }
}

impl KafkaChildren {
    /// Children sent with `client` (an operator's client: a tenant's would put them on its
    /// own topics), specs encoded by `encode`. Starts the client's live view.
    pub async fn new(client: Client, encode: SpecEncoder) -> Result<Self, ClientError> {
        let live = client.live_view().await?;
        Ok(Self { client, live, encode })
    }

    /// The live view the children are read in: a worker that uses these children puts it
    /// in its [`crate::WorkerOptions::reads`], so that a child a newer Ferry wrote last
    /// stops it rather than leave a plan waiting on the child's older state.
    pub fn view(&self) -> LiveState {
        self.live.clone()
    }
}

/// Who a child's commands are from: its parent, `plan/<parent>` (its Start, Cancel and
/// Revert alike).
fn sent_by(parent: TaskId) -> String {
    format!("plan/{parent}")
}

fn unreachable_by(what: impl Into<String>) -> impl FnOnce(ClientError) -> ChildError {
    let what = what.into();
    move |e| ChildError::Unreachable { what, reason: e.to_string() }
}

impl Children for KafkaChildren {
    fn child_id(&self, kind: TaskKind, key: &str, on_behalf_of: &str) -> TaskId {
        self.client.id_for_key_of(kind, key, crate::tenants::tenant_of(on_behalf_of))
    }

    fn submit<'a>(&'a self, child: &'a ChildCommand) -> BoxFuture<'a, Result<TaskId, ChildError>> {
        async move {
            let encoded = (self.encode)(self.client.registry(), child.kind, &child.spec).map_err(|reason| ChildError::Spec { kind: child.kind, reason })?;
            let Some(subject) = child.subject.clone().or(encoded.subject) else {
                return Err(ChildError::Spec { kind: child.kind, reason: "no subject: give the step a subject (the kind derives none from its spec)".into() });
            };
            // The parent's deadline as it is (one already past ends the child at once).
            let opts = SubmitOptions {
                idempotency_key: Some(child.idempotency_key.clone()),
                requested_by: Some(sent_by(child.parent)),
                deadline_at_ms: child.deadline_ms,
                keep_partial: child.keep_partial,
                trace_parent: child.trace_parent.clone(),
                // A tenant's plan's child is the tenant's: its worker holds it to the
                // tenant's policy and records the tenant as who asked.
                for_tenant: crate::tenants::tenant_of(&child.on_behalf_of).map(str::to_owned),
                ..SubmitOptions::default()
            };
            self.client
                .submit_encoded(child.kind, &subject, encoded.bytes, opts)
                .await
                .map_err(unreachable_by(format!("submitting the {} child {}", child.kind, child.idempotency_key)))
        }
        .boxed()
    }

    fn snapshot(&self, id: TaskId) -> BoxFuture<'_, Result<Option<TaskSnapshot>, ChildError>> {
        async move {
            self.live.caught_up(READ_LIMIT).await.map_err(|e| ChildError::Unreachable { what: format!("reading child {id}'s snapshot"), reason: e.to_string() })?;
            Ok(self.live.get(id))
        }
        .boxed()
    }

    fn snapshots<'a>(&'a self, ids: &'a [TaskId]) -> BoxFuture<'a, Result<Vec<Option<TaskSnapshot>>, ChildError>> {
        async move {
            // One catch-up (a watermark request per partition of every task-state topic) for
            // the lot: a wave of a hundred children read one by one spent a second on it.
            self.live.caught_up(READ_LIMIT).await.map_err(|e| ChildError::Unreachable { what: format!("reading {} children's snapshots", ids.len()), reason: e.to_string() })?;
            Ok(ids.iter().map(|id| self.live.get(*id)).collect())
        }
        .boxed()
    }

    fn wait<'a>(
        &'a self,
        id: TaskId,
        limit: Duration,
        until: &'a mut (dyn FnMut(&TaskSnapshot) -> bool + Send),
    ) -> BoxFuture<'a, Result<TaskSnapshot, ChildError>> {
        async move {
            self.live.wait_for(id, limit, |s| until(s)).await.map_err(|e| match e {
                LiveError::WaitTimeout { .. } => ChildError::Timeout { task: id, waited: limit },
                e => ChildError::Unreachable { what: format!("following child {id}"), reason: e.to_string() },
            })
        }
        .boxed()
    }

    fn cancel<'a>(&'a self, kind: TaskKind, subject: &'a str, id: TaskId, parent: TaskId, reason: String) -> BoxFuture<'a, Result<(), ChildError>> {
        self.control(CommandAction::Cancel, kind, subject, id, parent, reason)
    }

    fn revert<'a>(&'a self, kind: TaskKind, subject: &'a str, id: TaskId, parent: TaskId, reason: String) -> BoxFuture<'a, Result<(), ChildError>> {
        self.control(CommandAction::Revert, kind, subject, id, parent, reason)
    }
}

impl KafkaChildren {
    /// Sends a Cancel or Revert of a child, as its parent (`requested_by` `plan/<parent>`,
    /// as its Start was), not as the user the worker runs as.
    fn control<'a>(&'a self, action: CommandAction, kind: TaskKind, subject: &'a str, id: TaskId, parent: TaskId, reason: String) -> BoxFuture<'a, Result<(), ChildError>> {
        async move {
            let env = CommandEnvelope { requested_by: sent_by(parent), ..self.client.control_envelope(kind, subject, id, action, Some(reason)) };
            self.client.send(&env, None).await.map_err(unreachable_by(format!("sending {action:?} of child {id}")))
        }
        .boxed()
    }
}
