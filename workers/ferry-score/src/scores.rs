//! Reading the compacted scores topic: the latest score of every cluster, for other
//! workers (deploy), dashboards and tests.

use std::collections::HashMap;

use ferry_runtime::{Client, ClientError};

use crate::spec::ClusterScore;

/// The newest `ClusterScore` of each cluster (by key), read from the topic's beginning to
/// its end; records that do not decode are skipped.
pub async fn latest(client: &Client) -> Result<HashMap<String, ClusterScore>, ClientError> {
    let topic = client.topics().scores().name.clone();
    let mut out = HashMap::new();
    for (_, payload) in client.read_to_end(&topic).await? {
        if let Ok(s) = client.registry().decode::<ClusterScore>(&payload) {
            out.insert(s.cluster.clone(), s);
        }
    }
    Ok(out)
}
