//! Kubernetes errors in words an operator reads: kube's own `Display` of an API server's
//! refusal appends the whole `Status` in Rust's debug notation, which no user-facing line
//! (a step's error, an event, the dashboard) should carry.

use kube::runtime::watcher;

/// What `e` says: an API server's refusal as its `Status` words it, with its reason and
/// code (`namespaces "edge-1" not found (NotFound, 404)`); any other error as kube words it.
pub fn said(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => status(&s.message, &s.reason, s.code),
        e => e.to_string(),
    }
}

/// What a watch's error says, as [`said`] words the API server's part.
pub fn watch_said(e: &watcher::Error) -> String {
    match e {
        watcher::Error::InitialListFailed(e) => format!("failed to perform initial object list: {}", said(e)),
        watcher::Error::WatchStartFailed(e) => format!("failed to start watching object: {}", said(e)),
        watcher::Error::WatchError(s) => format!("error returned by apiserver during watch: {}", status(&s.message, &s.reason, s.code)),
        watcher::Error::WatchFailed(e) => format!("watch stream failed: {}", said(e)),
        e => e.to_string(),
    }
}

fn status(message: &str, reason: &str, code: u16) -> String {
    match (message.is_empty(), reason.is_empty()) {
        (false, false) => format!("{message} ({reason}, {code})"),
        (false, true) => format!("{message} ({code})"),
        (true, false) => format!("{reason} ({code})"),
        (true, true) => format!("the API server answered {code}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(message: &str, reason: &str, code: u16) -> kube::Error {
        kube::Error::Api(Box::new(kube::core::Status::failure(message, reason).with_code(code)))
    }

    #[test]
    fn a_refusal_is_said_without_rusts_debug_notation() {
        let e = refusal(r#"namespaces "member-1" not found"#, "NotFound", 404);
        assert!(e.to_string().contains("Status {"), "kube's own Display, which this replaces: {e}");
        assert_eq!(said(&e), r#"namespaces "member-1" not found (NotFound, 404)"#);
        assert_eq!(said(&refusal("", "Conflict", 409)), "Conflict (409)");
        let w = watcher::Error::InitialListFailed(refusal("the server could not find the requested resource", "NotFound", 404));
        assert_eq!(watch_said(&w), "failed to perform initial object list: the server could not find the requested resource (NotFound, 404)");
        // What a step's error says (`step_errors`), and so its StepFailed event and the dashboard.
        let step = crate::step_errors::hub_err(e);
        assert_eq!(step.message, r#"cluster "hub": namespaces "member-1" not found (NotFound, 404)"#);
    }
}
