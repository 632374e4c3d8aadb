//! Kubernetes name and label rules, as the API server applies them, so commands are
//! refused with a precise reason before anything is written.

/// Why `name` may not name a managed cluster in a command: the hub's name ([`crate::HUB`])
/// would make a worker act on the hub with its own identity, not as on a cluster.
pub fn hub_named(name: &str) -> Option<String> {
    (name == crate::HUB).then(|| format!("{name:?} names the hub, not a managed cluster: Ferry's commands act on managed clusters only"))
}

/// True for a DNS-1123 label (namespace, cluster and most object names).
pub fn is_dns1123_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// True for a DNS-1123 subdomain (hostnames, label-key prefixes).
pub fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns1123_label)
}

/// A qualified name: alphanumerics, `-`, `_`, `.`, at most 63, alphanumeric at both ends.
fn is_qualified_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && s.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && s.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric())
}

/// True for a label key: `[prefix/]name`, the prefix a DNS-1123 subdomain.
pub fn is_label_key(s: &str) -> bool {
    match s.split_once('/') {
        Some((prefix, name)) => is_dns1123_subdomain(prefix) && is_qualified_name(name),
        None => is_qualified_name(s),
    }
}

/// True for a label value: empty, or a qualified name.
pub fn is_label_value(s: &str) -> bool {
    s.is_empty() || is_qualified_name(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hub_is_not_a_cluster_name() {
        assert!(hub_named("hub").unwrap().contains("names the hub"));
        assert_eq!(hub_named("hub-1"), None);
    }

    #[test]
    fn rules_match_the_api_server() {
        assert!(is_dns1123_label("edge-1"));
        assert!(!is_dns1123_label("Edge"));
        assert!(!is_dns1123_label("-a"));
        assert!(!is_dns1123_label(&"a".repeat(64)));
        assert!(is_label_key("ferry.dev/tier"));
        assert!(is_label_key("tier"));
        assert!(!is_label_key("ferry.dev/"));
        assert!(!is_label_key("Ferry_/x"));
        assert!(is_label_value(""));
        assert!(is_label_value("gold.v1"));
        assert!(!is_label_value("gold!"));
        assert!(!is_label_value("-gold"));
    }
}
