//! Recognizes secret material (kubeconfig credentials, tokens, private keys, passwords) in
//! bytes, for the scans that prove none reached a Kafka topic or a log.

/// Markers of secret material, with what each one means.
const MARKERS: &[(&str, &str)] = &[
    ("client-key-data", "a kubeconfig client key"),
    ("client-certificate-data", "a kubeconfig client certificate"),
    ("certificate-authority-data", "a kubeconfig CA (a kubeconfig copied whole)"),
    ("-----BEGIN RSA PRIVATE KEY-----", "a private key"),
    ("-----BEGIN PRIVATE KEY-----", "a private key"),
    ("-----BEGIN EC PRIVATE KEY-----", "a private key"),
    ("\"token\":", "a bearer token field"),
    ("token: ", "a kubeconfig token"),
    ("sasl.password", "a Kafka password setting"),
    ("eyJhbGciOi", "a JSON web token"),
];

/// What a scan found, if anything: the meaning of the first marker present.
pub fn find(bytes: &[u8]) -> Option<&'static str> {
    let text = String::from_utf8_lossy(bytes);
    MARKERS.iter().find(|(m, _)| text.contains(m)).map(|(_, what)| *what)
}

/// As [`find`], also matching any of `known` (actual secret values of the test, e.g. the
/// fleet's admin tokens), which no marker would catch.
pub fn find_with(bytes: &[u8], known: &[String]) -> Option<String> {
    if let Some(what) = find(bytes) {
        return Some(what.to_owned());
    }
    let text = String::from_utf8_lossy(bytes);
    known.iter().filter(|k| k.len() >= 8).find(|k| text.contains(k.as_str())).map(|_| "a known secret value".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_kubeconfigs_tokens_and_keys_but_not_names() {
        assert_eq!(find(b"users:\n- name: a\n  user:\n    token: abc"), Some("a kubeconfig token"));
        assert_eq!(find(b"clusters: [{cluster: {certificate-authority-data: LS0t}}]"), Some("a kubeconfig CA (a kubeconfig copied whole)"));
        assert_eq!(find(b"x -----BEGIN PRIVATE KEY----- y"), Some("a private key"));
        assert_eq!(find(br#"{"kubeconfig_secret":"ferry-fleet/member-1-kubeconfig"}"#), None, "naming a Secret is fine");
        assert_eq!(find_with(b"abc s3cr3t-value xyz", &["s3cr3t-value".into()]), Some("a known secret value".into()));
        assert_eq!(find_with(b"nothing here", &["s3cr3t-value".into(), "short".into()]), None);
    }
}
