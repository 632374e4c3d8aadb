//! Each worker's `ferry dev --demo <name>`: the scripted scenario a newcomer runs on the
//! embedded broker and the simulated fleet, which exits 0 only when every check passed.

use std::process::Command;

fn demo(name: &str) {
    if !ferry_fleet::binaries::Binaries::installed() {
        ferry_runtime::report::missing_prerequisite(&format!("the test bed is not installed (scripts/install-testbed.sh), needed by the {name} demo"));
        return;
    }
    let state = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ferry")).args(["dev", "--demo", name]).env("FERRY_STATE", state.path()).output().expect("ferry runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(out.status.success(), "ferry dev --demo {name} exited {:?}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    assert!(!stdout.contains("MISMATCH"), "{stdout}");
}

#[test]
fn score_demo_ranks_three_clusters() {
    demo("score");
}

#[test]
fn deploy_demo_runs_an_app_across_two_clusters_and_deletes_it() {
    demo("deploy");
}

#[test]
fn create_cluster_demo_creates_scales_and_deletes_a_cluster() {
    demo("create-cluster");
}

#[test]
fn peer_offload_demo_peers_offloads_runs_a_pod_remotely_and_undoes_it() {
    demo("peer-offload");
}
