//! The crate graph is the architecture (docs/ARCHITECTURE.md, "Crates"): this test reads
//! `cargo metadata` and fails on any edge the layout forbids, naming it.
//!
//! - `crates/` (ferry-task, ferry-runtime, ferry-kube): the foundation. ferry-task depends
//!   on no project crate; ferry-runtime and ferry-kube only on ferry-task.
//! - `workers/`: one crate per task kind, built only on `crates/`: never on another worker
//!   or on `testing/` (a worker's own tests may: dev-dependencies are not production edges).
//! - `testing/` (test bed, test kit) and the `ferry` binary may depend on anything.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Where a workspace member lives: the folder under the workspace root (`crates`,
/// `workers`, `testing`), or `root` for the `ferry` package itself.
fn layer(root: &Path, manifest: &Path) -> String {
    let dir = manifest.parent().unwrap();
    if dir == root {
        return "root".into();
    }
    dir.strip_prefix(root).unwrap().components().next().unwrap().as_os_str().to_string_lossy().into_owned()
}

/// The workspace's production edges: member name → (its layer, the project crates it
/// depends on outside dev-dependencies).
fn edges() -> BTreeMap<String, (String, Vec<String>)> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--no-deps", "--offline"])
        .current_dir(&root)
        .output()
        .expect("cargo metadata runs");
    assert!(out.status.success(), "cargo metadata: {}", String::from_utf8_lossy(&out.stderr));
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let packages = meta["packages"].as_array().unwrap();
    let members: Vec<String> = packages.iter().map(|p| p["name"].as_str().unwrap().to_owned()).collect();
    packages
        .iter()
        .map(|p| {
            let name = p["name"].as_str().unwrap().to_owned();
            let manifest = PathBuf::from(p["manifest_path"].as_str().unwrap());
            let deps = p["dependencies"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|d| d["kind"].as_str() != Some("dev"))
                .map(|d| d["name"].as_str().unwrap().to_owned())
                .filter(|d| members.contains(d))
                .collect();
            (name, (layer(&root, &manifest), deps))
        })
        .collect()
}

/// Every forbidden edge of `graph`, as "from → to: why".
fn violations(graph: &BTreeMap<String, (String, Vec<String>)>) -> Vec<String> {
    let layer_of = |n: &str| graph.get(n).map(|(l, _)| l.as_str()).unwrap_or("?");
    let mut found = Vec::new();
    for (from, (layer, deps)) in graph {
        for to in deps {
            let why = match (layer.as_str(), from.as_str(), layer_of(to), to.as_str()) {
                ("crates", "ferry-task", _, _) => Some("ferry-task depends on no project crate"),
                ("crates", _, "crates", "ferry-task") => None,
                ("crates", _, _, _) => Some("ferry-runtime and ferry-kube depend only on ferry-task"),
                ("workers", _, "workers", _) => Some("a worker never depends on another worker"),
                ("workers", _, "testing", _) => Some("a worker never depends on the test bed or test kit (dev-dependencies only)"),
                ("workers", _, "crates", _) => None,
                ("workers", _, _, _) => Some("a worker depends only on crates/"),
                _ => None,
            };
            if let Some(why) = why {
                found.push(format!("{from} → {to}: {why}"));
            }
        }
    }
    found
}

#[test]
fn the_crate_graph_has_no_forbidden_edge() {
    let graph = edges();
    for expected in ["ferry-task", "ferry-runtime", "ferry-kube", "ferry-fleet", "ferry-testkit", "ferry-deploy"] {
        assert!(graph.contains_key(expected), "{expected} is a workspace member: {:?}", graph.keys().collect::<Vec<_>>());
    }
    let found = violations(&graph);
    assert!(found.is_empty(), "forbidden edges:\n{}", found.join("\n"));
}

#[test]
fn the_checker_sees_each_kind_of_forbidden_edge() {
    // A checker that reports nothing proves nothing: each rule is shown to fire.
    let g = |edges: &[(&str, &str, &[&str])]| -> BTreeMap<String, (String, Vec<String>)> {
        edges.iter().map(|(n, l, d)| (n.to_string(), (l.to_string(), d.iter().map(|s| s.to_string()).collect()))).collect()
    };
    let graph = g(&[
        ("ferry-task", "crates", &["ferry-kube"]),
        ("ferry-kube", "crates", &["ferry-task", "ferry-runtime"]),
        ("ferry-runtime", "crates", &["ferry-task"]),
        ("ferry-deploy", "workers", &["ferry-kube", "ferry-score", "ferry-fleet"]),
        ("ferry-score", "workers", &["ferry-task", "ferry-runtime"]),
        ("ferry-fleet", "testing", &["ferry-kube"]),
        ("ferry", "root", &["ferry-fleet", "ferry-deploy"]),
    ]);
    let found = violations(&graph);
    assert_eq!(
        found,
        [
            "ferry-deploy → ferry-score: a worker never depends on another worker",
            "ferry-deploy → ferry-fleet: a worker never depends on the test bed or test kit (dev-dependencies only)",
            "ferry-kube → ferry-runtime: ferry-runtime and ferry-kube depend only on ferry-task",
            "ferry-task → ferry-kube: ferry-task depends on no project crate",
        ]
    );
}
