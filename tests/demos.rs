//! Each worker's `ferry dev --demo <name>`: the scripted scenario a newcomer runs on the
//! embedded broker and the simulated fleet, which exits 0 only when every check passed and
//! prints words, not Rust debug text; and `smoke`, the runtime alone.

// Each kind registers itself in its worker crate (ferry_task::kind): link every one Ferry
// ships, as the `ferry` binary does, so that topics and schemas cover them all.
use {ferry_cluster as _, ferry_deploy as _, ferry_offload as _, ferry_peer as _, ferry_plan as _, ferry_score as _};

use std::process::Command;

fn demo(name: &str) {
    if name != "smoke" && !ferry_fleet::binaries::Binaries::installed() {
        ferry_runtime::report::missing_prerequisite(&format!("the test bed is not installed (scripts/install-testbed.sh), needed by the {name} demo"));
        return;
    }
    let state = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ferry")).args(["dev", "--demo", name]).env("FERRY_STATE", state.path()).output().expect("ferry runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(out.status.success(), "ferry dev --demo {name} exited {:?}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    assert!(!stdout.contains("MISMATCH"), "{stdout}");
    // What a newcomer reads is words, not Rust's Debug of an Option, a Result or a list.
    let debug: Vec<&str> = stdout.lines().filter(|l| ["Some(", "None)", "Ok(", "Err(", "[]", "[\""].iter().any(|p| l.contains(p))).collect();
    assert!(debug.is_empty(), "Rust debug text in the {name} demo's output: {debug:#?}");
}

/// The README's runtime-only demo (no test bed): success, revert, retries, cancel.
#[test]
fn smoke_demo_runs_the_runtime_alone() {
    demo("smoke");
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

#[test]
fn plan_demo_runs_four_workers_as_one_plan_puts_back_a_failed_wave_and_reverts_without_a_trace() {
    demo("plan");
}

/// A running `ferry dev` and a shell to run README lines against it: `ferry` on the PATH is
/// the binary under test, the config file and the dev state are the test's own.
struct Dev {
    process: std::process::Child,
    state: tempfile::TempDir,
    config: tempfile::TempDir,
    bin: tempfile::TempDir,
}

impl Dev {
    /// `ferry dev ARGS` in the project's root, once ready.
    fn start(args: &[&str]) -> Dev {
        use std::io::{BufRead, BufReader};
        use std::process::Stdio;
        let state = tempfile::tempdir().unwrap();
        let mut process = Command::new(env!("CARGO_BIN_EXE_ferry"))
            .arg("dev")
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .env("FERRY_STATE", state.path())
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let stderr = process.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        // Ready: the fleet, the broker, the workers, the members joined (minutes on a loaded machine).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(600);
        let mut seen = Vec::new();
        loop {
            match rx.recv_timeout(deadline.saturating_duration_since(std::time::Instant::now())) {
                Ok(line) if line.contains("ferry dev: ready") => break,
                Ok(line) => seen.push(line),
                Err(_) => {
                    let _ = process.kill();
                    panic!("ferry dev was not ready within 600 s:\n{}", seen.join("\n"));
                }
            }
        }
        let bin = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_ferry"), bin.path().join("ferry")).unwrap();
        Dev { process, state, config: tempfile::tempdir().unwrap(), bin }
    }

    /// A bash command as a user types it in the project's root.
    fn shell(&self, line: &str) -> Command {
        let mut c = Command::new("bash");
        let path = format!("{}:{}", self.bin.path().display(), std::env::var("PATH").unwrap_or_default());
        c.arg("-c").arg(line).current_dir(env!("CARGO_MANIFEST_DIR")).env("PATH", path).env("FERRY_STATE", self.state.path()).env("XDG_CONFIG_HOME", self.config.path());
        c
    }

    /// Runs `line` to its end: whether it succeeded, and stdout then stderr.
    fn run(&self, line: &str) -> (bool, String) {
        let out = self.shell(line).output().unwrap();
        (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
    }

    /// Runs `line`, which must succeed; returns its output.
    fn ok(&self, line: &str) -> String {
        let (ok, out) = self.run(line);
        assert!(ok, "README example failed: {line}\n{out}");
        out
    }

    /// A test task that blocks in its first step until cancelled; its id.
    fn blocker(&self, subject: &str) -> String {
        let spec = format!("subject: {subject}\nspec: {{steps: 2, fail_transient: 0, step_ms: 0, block_at: 1}}\n");
        let out = self.ok(&format!("ferry submit test -f - <<'EOF'\n{spec}EOF"));
        task_id(&out).unwrap_or_else(|| panic!("no task id in {out}"))
    }

    /// A long-running command with its stdout and stderr lines on one channel.
    fn spawn(&self, line: &str) -> (std::process::Child, std::sync::mpsc::Receiver<String>) {
        use std::io::{BufRead, BufReader};
        use std::process::Stdio;
        let mut child = self.shell(&format!("exec {line}")).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let (out, err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
        let tx2 = tx.clone();
        std::thread::spawn(move || BufReader::new(out).lines().map_while(Result::ok).for_each(|l| drop(tx.send(l))));
        std::thread::spawn(move || BufReader::new(err).lines().map_while(Result::ok).for_each(|l| drop(tx2.send(l))));
        (child, rx)
    }
}

impl Drop for Dev {
    fn drop(&mut self) {
        // Ctrl-C, as the README says.
        let _ = Command::new("kill").args(["-INT", &self.process.id().to_string()]).status();
        let _ = self.process.wait();
    }
}

/// The first task id in `out`.
fn task_id(out: &str) -> Option<String> {
    let i = out.find("tsk_")?;
    Some(out[i..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect())
}

/// Lines from `rx` until one satisfies `want`, within `secs`; every line read otherwise.
fn wait_line(rx: &std::sync::mpsc::Receiver<String>, secs: u64, want: impl Fn(&str) -> bool) -> Result<String, Vec<String>> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    let mut seen = Vec::new();
    loop {
        match rx.recv_timeout(deadline.saturating_duration_since(std::time::Instant::now())) {
            Ok(l) if want(&l) => return Ok(l),
            Ok(l) => seen.push(l),
            Err(_) => return Err(seen),
        }
    }
}

/// The README's command lines: its "Using the CLI" block (with the other files a submit
/// line's comment names, [`alternatives`]), and each per-kind example of "Running against
/// a real Kafka" as `ferry submit <kind> -f FILE --wait`.
fn readme_lines() -> Vec<String> {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let block = readme.split("## Using the CLI").nth(1).and_then(|s| s.split("```sh\n").nth(1)).and_then(|s| s.split("```").next()).expect("the README's CLI block");
    let mut lines: Vec<String> = Vec::new();
    for l in block.lines() {
        let (command, comment) = l.split_once(" # ").unwrap_or((l, ""));
        let command = command.trim();
        if command.is_empty() {
            continue;
        }
        lines.push(command.to_owned());
        lines.extend(alternatives(command, comment));
    }
    let kinds = readme.split("4. Commands, one example per kind").nth(1).and_then(|s| s.split("\n5.").next()).expect("the README's per-kind commands");
    for l in kinds.lines() {
        let l = l.trim_start();
        if let Some((kind, rest)) = l.strip_prefix("- ").and_then(|l| l.split_once(": `")) {
            let file = rest.split('`').next().unwrap();
            // The same command appears once in the CLI block already: run once (a second
            // deploy of one app is rightly Rejected: "already deployed; send operation update").
            let line = format!("ferry submit {kind} -f {file} --wait");
            if !lines.contains(&line) {
                lines.push(line);
            }
        }
    }
    lines
}

/// The commands a submit line's comment names beside it, as a reader runs them next:
/// `# or burst.yaml`, `# also scale-cluster.yaml, delete-cluster.yaml` (the same kind, those
/// files), `# or --tosca FILE --cluster C` (the same kind, those arguments).
fn alternatives(command: &str, comment: &str) -> Vec<String> {
    let Some(kind) = command.strip_prefix("ferry submit ").and_then(|c| c.split(' ').next()) else { return Vec::new() };
    let Some(named) = comment.trim().strip_prefix("or ").or_else(|| comment.trim().strip_prefix("also ")) else { return Vec::new() };
    if named.starts_with("--") {
        return vec![format!("ferry submit {kind} {named} --wait")];
    }
    named.split(", ").map(|f| format!("ferry submit {kind} -f examples/{} --wait", f.trim())).collect()
}

#[test]
fn the_readmes_alternatives_are_read_as_a_reader_runs_them() {
    let or = alternatives("ferry submit offload -f examples/offload-namespace.yaml --wait", " or burst.yaml");
    assert_eq!(or, ["ferry submit offload -f examples/burst.yaml --wait"]);
    let also = alternatives("ferry submit create-cluster -f examples/create-cluster.yaml --wait", " also scale-cluster.yaml, delete-cluster.yaml");
    assert_eq!(also, ["ferry submit create-cluster -f examples/scale-cluster.yaml --wait", "ferry submit create-cluster -f examples/delete-cluster.yaml --wait"]);
    let tosca = alternatives("ferry submit deploy -f examples/deploy.yaml --wait", " or --tosca examples/blog.tosca.yaml --cluster member-1");
    assert_eq!(tosca, ["ferry submit deploy --tosca examples/blog.tosca.yaml --cluster member-1 --wait"]);
    assert!(alternatives("ferry tasks list --state Running", "").is_empty());
    assert!(alternatives("ferry submit test -f examples/test-task.yaml --wait", " exit 0 only if the task succeeds").is_empty());
    // Every alternative the README names is a file there.
    for l in readme_lines().iter().filter(|l| l.contains(" -f examples/")) {
        let file = l.split(" -f ").nth(1).and_then(|r| r.split(' ').next()).unwrap();
        assert!(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(file).is_file(), "{l}: no such file");
    }
}

/// Every README command line, verbatim (`tsk_...` stands for a task the test made for
/// it), in the README's order, on a plain `ferry dev` (its members joined to OCM through
/// their klusterlets, in set `demo`). A line no rule here covers fails the test, so a new
/// example is run too.
#[test]
fn readme_examples_run_verbatim_on_ferry_dev() {
    if !ferry_fleet::binaries::Binaries::installed() {
        ferry_runtime::report::missing_prerequisite("the test bed is not installed (scripts/install-testbed.sh), needed by ferry dev");
        return;
    }
    let lines = readme_lines();
    assert!(lines.len() >= 15, "the README's examples: {lines:#?}");
    // With the example policy, as the README's tenants section says to try it: an
    // operator's commands are not held to it.
    let dev = Dev::start(&["--policy", "examples/tenants.yaml"]);
    // The test task the first example submits: `tasks get` and `tasks revert` act on it.
    let mut submitted: Option<String> = None;
    for line in &lines {
        println!("README: {line}");
        let cmd = line.strip_prefix("ferry ").unwrap_or(line);
        if cmd.starts_with("submit ") && cmd.contains("--wait") {
            let out = dev.ok(line);
            if cmd.starts_with("submit test -f examples/") {
                submitted = task_id(&out);
            }
        } else if cmd.starts_with("tasks list") || cmd.starts_with("apps list") || cmd.starts_with("config ") {
            dev.ok(line);
        } else if cmd == "fleet" {
            let out = dev.ok(line);
            assert!(out.contains("CLUSTER") && out.contains("member-1") && out.contains("member-2"), "{line}: {out}");
        } else if cmd.starts_with("tasks get tsk_...") {
            let id = submitted.clone().expect("a test task submitted first");
            let out = dev.ok(&line.replace("tsk_...", &id));
            assert!(out.contains(&id), "{line}: {out}");
        } else if cmd.starts_with("tasks revert tsk_...") {
            let id = submitted.clone().expect("a test task submitted first");
            let out = dev.ok(&line.replace("tsk_...", &id));
            assert!(!cmd.contains("--dry-run") || out.contains("dry run: nothing sent"), "{line}: {out}");
        } else if cmd.starts_with("tasks watch tsk_...") {
            // Until it ends: the test task ended already, so its end is printed at once.
            let id = submitted.clone().expect("a test task submitted first");
            let out = dev.ok(&line.replace("tsk_...", &id));
            assert!(out.contains(&format!("{id} test ")), "{line}: {out}");
        } else if cmd.starts_with("tasks cancel tsk_...") {
            // A task that runs until cancelled; it must end Cancelled, with the reason given.
            let id = dev.blocker("readme/cancel");
            dev.ok(&line.replace("tsk_...", &id));
            let (_, end) = dev.run(&format!("ferry tasks watch {id}"));
            assert!(end.contains(&format!("{id} test readme/cancel Cancelled")), "{line}: the task did not end Cancelled: {end}");
            if let Some(reason) = line.split("--reason \"").nth(1).and_then(|r| r.split('"').next()) {
                let got = dev.ok(&format!("ferry tasks get {id}"));
                assert!(got.contains(reason), "{line}: `tasks get` does not show the reason: {got}");
            }
        } else if cmd == "tasks watch" {
            // It follows every running task and prints each end: a task cancelled once it
            // follows must show up.
            let id = dev.blocker("readme/watch");
            let (mut watch, rx) = dev.spawn(line);
            let started = wait_line(&rx, 60, |l| l.starts_with("watching "));
            let ended = started.is_ok().then(|| {
                dev.ok(&format!("ferry tasks cancel {id}"));
                wait_line(&rx, 120, |l| l.contains(&id) && l.ends_with("Cancelled"))
            });
            let _ = watch.kill();
            let _ = watch.wait();
            assert!(started.is_ok(), "{line} did not start following: {started:?}");
            assert!(ended.as_ref().is_some_and(Result::is_ok), "{line} did not print the end of {id}: {ended:?}");
        } else if cmd.starts_with("dashboard ") {
            let (mut dash, rx) = dev.spawn(line);
            let url = wait_line(&rx, 60, |l| l.starts_with("dashboard: http://"));
            let page = url.as_ref().ok().map(|u| {
                use std::io::{Read, Write};
                let addr = u.trim_start_matches("dashboard: http://").trim_end_matches('/').to_owned();
                let mut s = std::net::TcpStream::connect(&addr).unwrap();
                write!(s, "GET / HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
                let mut body = String::new();
                let _ = s.read_to_string(&mut body);
                body
            });
            let _ = dash.kill();
            let _ = dash.wait();
            assert!(url.is_ok(), "{line} did not listen: {url:?}");
            let page = page.unwrap();
            assert!(page.starts_with("HTTP/1.0 200") || page.starts_with("HTTP/1.1 200"), "{line}: GET / answered {}", page.lines().next().unwrap_or_default());
        } else if cmd.starts_with("submit test -f - ") {
            dev.ok(line);
        } else if line.starts_with("source <(ferry completions bash)") {
            dev.ok(&format!("{line} && complete -p ferry"));
        } else {
            panic!("a README example no rule of this test runs: {line}");
        }
    }
    // The tenants section's commands on this `ferry dev --policy examples/tenants.yaml`: a
    // tenant's task runs as the tenant's; what its policy does not give it is refused.
    let tenants = readme_tenant_lines();
    assert_eq!(tenants.len(), 2, "{tenants:?}");
    println!("README: {}", tenants[0]);
    let out = dev.ok(&tenants[0]);
    let id = task_id(&out).unwrap_or_else(|| panic!("no task id in {out}"));
    let got = dev.ok(&format!("ferry tasks get {id}"));
    assert!(got.contains("tenant:web"), "{}: not the tenant's: {got}", tenants[0]);
    println!("README: {}", tenants[1]);
    let (ok, out) = dev.run(&tenants[1]);
    assert!(!ok && out.contains("may not submit create-cluster tasks"), "{}: {out}", tenants[1]);
}

/// The commands the README's tenants section gives to try on `ferry dev`.
fn readme_tenant_lines() -> Vec<String> {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let section = readme.split("5. Tenants (optional)").nth(1).and_then(|s| s.split("\n## ").next()).expect("the README's tenants section");
    section.split('`').filter(|s| s.starts_with("ferry submit ")).map(str::to_owned).collect()
}
