//! Who may do what on the dashboard. Every request: its `Host` must be one the dashboard
//! serves (a DNS-rebinding page cannot talk to it under another name). Reading needs
//! nothing. An action (Revert, Cancel) needs all of: a configured operator token
//! (`--token-file`, e.g. a mounted Secret; without one the dashboard is read-only), that
//! token as `Authorization: Bearer`, the page's CSRF token as `X-CSRF-Token`, and, when
//! the browser says where the request comes from (`Origin`, `Sec-Fetch-Site`), this
//! origin. A cross-site form post carries none of the headers and is refused.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// The dashboard's access rules.
#[derive(Debug)]
pub struct Access {
    /// `Host` values served; empty: any (a dashboard behind a proxy that checks it).
    pub hosts: Vec<String>,
    /// The operator token; None: read-only.
    pub token: Option<String>,
    /// This process's CSRF token, given to the page.
    pub csrf: String,
    /// Refusals by reason, for `/metrics`.
    pub refused: Refusals,
}

/// Counters of refused requests.
#[derive(Debug, Default)]
pub struct Refusals {
    /// An unknown Host.
    pub host: AtomicU64,
    /// An action on a read-only dashboard.
    pub read_only: AtomicU64,
    /// An action without the operator token.
    pub unauthenticated: AtomicU64,
    /// An action without the CSRF token or from another origin.
    pub cross_site: AtomicU64,
}

impl Access {
    /// Rules for a dashboard on `hosts` with operator token `token`.
    pub fn new(hosts: Vec<String>, token: Option<String>) -> Self {
        let csrf = format!("{:032x}", rand::random::<u128>());
        Self { hosts, token, csrf, refused: Refusals::default() }
    }

    /// The `Host` values a dashboard listening on `addr` answers to by default: its
    /// loopback names with the port when it listens on loopback; any otherwise.
    pub fn default_hosts(addr: std::net::SocketAddr) -> Vec<String> {
        if !addr.ip().is_loopback() {
            return Vec::new();
        }
        let port = addr.port();
        vec![format!("127.0.0.1:{port}"), format!("localhost:{port}"), format!("[::1]:{port}")]
    }

    /// Why `req` may not go on (status and reason), or None.
    pub fn check(&self, method: &Method, headers: &HeaderMap) -> Option<(StatusCode, &'static str, &AtomicU64)> {
        let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("");
        if !self.hosts.is_empty() && !self.hosts.iter().any(|h| h.eq_ignore_ascii_case(host)) {
            return Some((StatusCode::MISDIRECTED_REQUEST, "this dashboard does not serve that host name", &self.refused.host));
        }
        if *method == Method::GET || *method == Method::HEAD {
            return None;
        }
        let Some(token) = &self.token else {
            return Some((StatusCode::FORBIDDEN, "the dashboard is read-only: start it with --token-file to allow actions", &self.refused.read_only));
        };
        let given = headers.get(header::AUTHORIZATION).and_then(|h| h.to_str().ok()).and_then(|h| h.strip_prefix("Bearer "));
        if !given.is_some_and(|g| constant_time_eq(g.as_bytes(), token.as_bytes())) {
            return Some((StatusCode::UNAUTHORIZED, "an action needs the operator token (Authorization: Bearer)", &self.refused.unauthenticated));
        }
        let csrf = headers.get("x-csrf-token").and_then(|h| h.to_str().ok());
        let same_site = headers.get("sec-fetch-site").and_then(|h| h.to_str().ok()).is_none_or(|s| s == "same-origin");
        let origin_ok = headers.get(header::ORIGIN).and_then(|h| h.to_str().ok()).is_none_or(|o| {
            o.strip_prefix("http://").or_else(|| o.strip_prefix("https://")).is_some_and(|rest| rest.eq_ignore_ascii_case(host))
        });
        if csrf != Some(self.csrf.as_str()) || !same_site || !origin_ok {
            return Some((StatusCode::FORBIDDEN, "an action must come from the dashboard's own page (CSRF token, same origin)", &self.refused.cross_site));
        }
        None
    }

    /// Prometheus text of the refusals.
    pub fn metrics(&self) -> String {
        let r = &self.refused;
        let mut out = String::from("# HELP ferry_dashboard_refused_total Requests the dashboard refused, by reason.\n# TYPE ferry_dashboard_refused_total counter\n");
        for (reason, n) in [("host", &r.host), ("read_only", &r.read_only), ("unauthenticated", &r.unauthenticated), ("cross_site", &r.cross_site)] {
            out.push_str(&format!("ferry_dashboard_refused_total{{reason=\"{reason}\"}} {}\n", n.load(Ordering::Relaxed)));
        }
        out
    }
}

/// Compares without an early exit on the first differing byte.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The middleware: refuses what [`Access::check`] refuses.
pub async fn guard(State(access): State<Arc<Access>>, req: Request, next: Next) -> Response {
    if let Some((status, why, counter)) = access.check(req.method(), req.headers()) {
        counter.fetch_add(1, Ordering::Relaxed);
        return (status, axum::Json(serde_json::json!({"error": why}))).into_response();
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn reads_are_free_actions_need_token_csrf_and_the_same_origin() {
        let a = Access::new(Access::default_hosts("127.0.0.1:8080".parse().unwrap()), Some("s3cret".into()));
        let host = ("host", "127.0.0.1:8080");
        let reason = |m: Method, h: &[(&'static str, &str)]| a.check(&m, &headers(h)).map(|(s, _, _)| s);
        assert_eq!(reason(Method::GET, &[host]), None);
        assert_eq!(reason(Method::GET, &[("host", "evil.example:8080")]), Some(StatusCode::MISDIRECTED_REQUEST), "DNS rebinding");
        let csrf = a.csrf.clone();
        let good = [host, ("authorization", "Bearer s3cret"), ("x-csrf-token", csrf.as_str()), ("origin", "http://127.0.0.1:8080"), ("sec-fetch-site", "same-origin")];
        assert_eq!(reason(Method::POST, &good), None);
        // A cross-site form post: no token, no CSRF header, another origin.
        assert_eq!(reason(Method::POST, &[host, ("origin", "http://evil.example"), ("content-type", "application/x-www-form-urlencoded")]), Some(StatusCode::UNAUTHORIZED));
        assert_eq!(reason(Method::POST, &[host, ("authorization", "Bearer wrong"), ("x-csrf-token", csrf.as_str())]), Some(StatusCode::UNAUTHORIZED));
        assert_eq!(reason(Method::POST, &[host, ("authorization", "Bearer s3cret")]), Some(StatusCode::FORBIDDEN), "no CSRF token");
        let mut other_origin = good;
        other_origin[3] = ("origin", "http://evil.example");
        assert_eq!(reason(Method::POST, &other_origin), Some(StatusCode::FORBIDDEN));
        let mut cross_site = good;
        cross_site[4] = ("sec-fetch-site", "cross-site");
        assert_eq!(reason(Method::POST, &cross_site), Some(StatusCode::FORBIDDEN));
        // Without a configured token the dashboard is read-only.
        let ro = Access::new(Vec::new(), None);
        assert_eq!(ro.check(&Method::POST, &headers(&good)).map(|(s, _, _)| s), Some(StatusCode::FORBIDDEN));
        assert!(ro.metrics().contains("ferry_dashboard_refused_total{reason=\"read_only\"} 0"));
    }
}
