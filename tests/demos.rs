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

/// The README's "Using the CLI" score and deploy examples, verbatim, on a plain `ferry dev`
/// (its members joined to OCM through their klusterlets, in set `demo`).
#[test]
fn readme_score_and_deploy_examples_run_on_ferry_dev() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    if !ferry_fleet::binaries::Binaries::installed() {
        ferry_runtime::report::missing_prerequisite("the test bed is not installed (scripts/install-testbed.sh), needed by ferry dev");
        return;
    }
    let state = tempfile::tempdir().unwrap();
    let mut dev = Command::new(env!("CARGO_BIN_EXE_ferry")).arg("dev").env("FERRY_STATE", state.path()).stderr(Stdio::piped()).stdout(Stdio::null()).spawn().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let stderr = dev.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    // Ready: the fleet, the broker, the workers, the members joined (minutes on a loaded machine).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(600);
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) if line.contains("ferry dev: ready") => break,
            Ok(line) => seen.push(line),
            Err(_) => {
                let _ = dev.kill();
                panic!("ferry dev was not ready within 600 s:\n{}", seen.join("\n"));
            }
        }
    }
    let submit = |file: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_ferry"))
            .args(["submit", file.split('/').nth(1).unwrap().trim_end_matches(".yaml"), "-f", file, "--wait"])
            .env("FERRY_STATE", state.path())
            .output()
            .unwrap();
        (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
    };
    let score = submit("examples/score.yaml");
    let deploy = submit("examples/deploy.yaml");
    // Ctrl-C, as the README says.
    let _ = Command::new("kill").args(["-INT", &dev.id().to_string()]).status();
    let _ = dev.wait();
    assert!(score.0, "ferry submit score -f examples/score.yaml --wait:\n{}", score.1);
    assert!(deploy.0, "ferry submit deploy -f examples/deploy.yaml --wait:\n{}", deploy.1);
}
