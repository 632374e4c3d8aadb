//! Which hub Secrets a deploy may copy to a cluster. A deploy command names Secrets by
//! name, and whoever may send one must not be able to ship the hub's credentials to a
//! cluster of their choice. So a Secret goes only when an operator marked it
//! ([`EXPORTABLE_LABEL`]`: "true"`), and never when it is a credential of the fleet
//! itself, marked or not: a service-account token, a Cluster API kubeconfig (its type or
//! its cluster label), or anything named `*-kubeconfig`.

use k8s_openapi::api::core::v1::Secret;

/// The label an operator puts on a Secret that deploys may copy to clusters.
pub const EXPORTABLE_LABEL: &str = "ferry.dev/exportable";

/// Why `s` may not leave the hub, or None.
pub fn refusal(s: &Secret) -> Option<String> {
    let name = s.metadata.name.as_deref().unwrap_or("");
    let labels = s.metadata.labels.clone().unwrap_or_default();
    let type_ = s.type_.as_deref().unwrap_or("Opaque");
    if type_ == "kubernetes.io/service-account-token" {
        return Some(format!("Secret {name:?} is a service-account token; Ferry never copies those"));
    }
    if type_ == "cluster.x-k8s.io/secret" || labels.contains_key("cluster.x-k8s.io/cluster-name") || name.ends_with("-kubeconfig") {
        return Some(format!("Secret {name:?} is a cluster's kubeconfig; Ferry never copies those"));
    }
    if labels.get(EXPORTABLE_LABEL).map(String::as_str) != Some("true") {
        return Some(format!("Secret {name:?} is not marked for export: an operator labels it {EXPORTABLE_LABEL}=true"));
    }
    None
}

/// Why a Secret a deploy references cannot be copied now.
#[derive(Debug)]
pub enum Unshippable {
    /// There is no Secret of this name in the app's namespace on the hub.
    Missing(String),
    /// It is there but may not leave the hub ([`refusal`]).
    Refused(String),
}

/// The Secrets `names` in `namespace` on the hub, each there and exportable (as a run
/// checks them just before copying, and a dry run before showing them); the first that is
/// not says why.
pub async fn read(hub: &kube::Client, namespace: &str, names: impl IntoIterator<Item = String>) -> Result<Result<Vec<(String, Secret)>, Unshippable>, kube::Error> {
    let api: kube::Api<Secret> = kube::Api::namespaced(hub.clone(), namespace);
    let mut out = Vec::new();
    for name in names {
        let Some(s) = api.get_opt(&name).await? else { return Ok(Err(Unshippable::Missing(name))) };
        if let Some(why) = refusal(&s) {
            return Ok(Err(Unshippable::Refused(why)));
        }
        out.push((name, s));
    }
    Ok(Ok(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(name: &str, type_: &str, labels: &[(&str, &str)]) -> Secret {
        serde_json::from_value(serde_json::json!({"metadata": {"name": name,
            "labels": labels.iter().map(|(k, v)| ((*k).to_owned(), serde_json::json!(v))).collect::<serde_json::Map<_, _>>()}, "type": type_}))
        .unwrap()
    }

    #[test]
    fn only_marked_secrets_leave_and_credentials_never() {
        assert_eq!(refusal(&secret("db", "Opaque", &[(EXPORTABLE_LABEL, "true")])), None);
        assert!(refusal(&secret("db", "Opaque", &[])).unwrap().contains("not marked for export"));
        let marked = [(EXPORTABLE_LABEL, "true")];
        assert!(refusal(&secret("member-1-kubeconfig", "cluster.x-k8s.io/secret", &marked)).unwrap().contains("kubeconfig"));
        assert!(refusal(&secret("x", "Opaque", &[(EXPORTABLE_LABEL, "true"), ("cluster.x-k8s.io/cluster-name", "m1")])).unwrap().contains("kubeconfig"));
        assert!(refusal(&secret("hub-kubeconfig", "Opaque", &marked)).unwrap().contains("kubeconfig"));
        assert!(refusal(&secret("default-token-abc", "kubernetes.io/service-account-token", &marked)).unwrap().contains("service-account token"));
    }
}
