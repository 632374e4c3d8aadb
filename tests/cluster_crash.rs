//! A `ferry worker create-cluster` process SIGKILLed while its Cluster provisions: the
//! other instance resumes the task from its journal, and exactly one Cluster, the same
//! one, exists afterwards (issue 4). Real worker processes against the embedded broker and
//! the test bed's hub with emulated Cluster API and OCM in this test process.

// Each kind registers itself in its worker crate (ferry_task::kind): link every one Ferry
// ships, as the `ferry` binary does, so that topics and schemas cover them all.
use {ferry_cluster as _, ferry_deploy as _, ferry_offload as _, ferry_peer as _, ferry_plan as _, ferry_score as _};

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use ferry_cluster::spec::{AddonRequest, ClusterCommand, MachinePool, WorkerPool};
use ferry_fleet::emulated_capi::CapiOptions;
use ferry_kube::kinds::{CapiCluster, CapiMachine};
use ferry_runtime::{EventType, SubmitOptions, TaskKind};
use ferry_testkit::Bed;
use kube::api::{Api, ListParams};

struct Worker(Child);

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn(bootstrap: &str, hub_kubeconfig: &std::path::Path) -> Worker {
    let child = Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(["worker", "create-cluster", "--brokers", bootstrap, "--addons", "emulated"])
        .arg("--kubeconfig")
        .arg(hub_kubeconfig)
        // Fast failure detection so a killed worker's partitions move in seconds.
        .args(["--kafka-property", "session.timeout.ms=6000", "--kafka-property", "heartbeat.interval.ms=500"])
        .args(["--kafka-property", "fetch.wait.max.ms=5"])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn ferry worker create-cluster");
    Worker(child)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_cluster_worker_killed_mid_provisioning_is_resumed() {
    let Some(bed) = Bed::builder().ocm().capi(CapiOptions::default()).brokers(3).start().await else { return };
    bed.capi.as_ref().expect("emulated Cluster API").set_default(|k| k.provision_delay = Duration::from_secs(3));
    let bootstrap = bed.broker().bootstrap();
    let client = bed.client();
    let mut workers: Vec<Worker> = (0..2).map(|_| spawn(&bootstrap, &bed.fleet.hub().kubeconfig)).collect();

    let cmd = ClusterCommand {
        name: "crashy".into(),
        namespace: Some("fleet".into()),
        infrastructure: "docker".into(),
        version: "v1.33.1".into(),
        control_plane: MachinePool { count: Some(1), flavor: None },
        workers: WorkerPool { count: Some(2), flavor: None },
        addons: vec![AddonRequest { name: "cni".into(), ..AddonRequest::default() }],
        ready_timeout_seconds: Some(240),
        ..ClusterCommand::default()
    };
    let mut events = client.events(false).await.unwrap();
    let id = client.submit(TaskKind::CREATE_CLUSTER, &cmd.subject(), &cmd, SubmitOptions::default()).await.unwrap();
    let wait = Duration::from_secs(300);
    let early = events.until(id, wait, |e| e.event == EventType::StepStarted && e.step_name.as_deref() == Some("infrastructure")).await.unwrap();
    let owner = early.last().unwrap().worker.clone();
    let hub = bed.hub().await;
    let clusters: Api<CapiCluster> = Api::namespaced(hub.clone(), "fleet");
    let uid = clusters.get("crashy").await.unwrap().metadata.uid;

    // SIGKILL the process that runs the task (worker ids are `<host>-<pid>-<rand>`).
    let i = workers.iter().position(|w| owner.contains(&format!("-{}-", w.0.id()))).expect("the owner is one of ours");
    let mut victim = workers.remove(i);
    victim.0.kill().unwrap();
    victim.0.wait().unwrap();

    let rest = events.until(id, wait, |e| e.event.is_final()).await.unwrap();
    let end = rest.last().unwrap();
    assert_eq!(end.event, EventType::Succeeded, "{end:?}");
    assert_ne!(end.worker, owner, "the surviving worker finished it");
    let all = clusters.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(all.len(), 1, "exactly one Cluster");
    assert_eq!(all[0].metadata.uid, uid, "the same Cluster, not a re-created one");
    let machines = Api::<CapiMachine>::namespaced(hub, "fleet").list(&ListParams::default()).await.unwrap().items;
    assert_eq!(machines.len(), 3, "one control-plane and two worker machines, none twice");
    drop(workers);
    drop(events);
    drop(client);
    bed.stop().await;
}
