//! Deleting the very object a worker read, never another of its name: a UID
//! precondition, and an object gone already or replaced counted as done.

use std::fmt::Debug;

use kube::api::{Api, DeleteParams, Preconditions};
use kube::core::ObjectMeta;
use serde::de::DeserializeOwned;

/// Deletes `name` through `api` only while it is still the object `read` describes (its
/// UID as a precondition, with `dp`'s propagation). Done (`Ok`) once deleted or its
/// deletion begun, and also when gone already (404) or replaced meanwhile by another object
/// of the name, which the precondition refused (409): not the caller's to delete.
pub async fn delete_if_unchanged<K>(api: &Api<K>, name: &str, read: &ObjectMeta, dp: DeleteParams) -> Result<(), kube::Error>
where
    K: Clone + DeserializeOwned + Debug,
{
    let dp = DeleteParams { preconditions: Some(Preconditions { uid: read.uid.clone(), resource_version: None }), ..dp };
    match api.delete(name, &dp).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}
