//! `ferry topics apply` against a real broker (tansu): creates every topic of
//! topics/topics.yaml with its partitions, and a second run changes nothing; with
//! `--policy`, the tenants' command topics too.

// Each kind registers itself in its worker crate (ferry_task::kind): link every one Ferry
// ships, as the `ferry` binary does, so that topics and schemas cover them all.
use {ferry_cluster as _, ferry_deploy as _, ferry_offload as _, ferry_peer as _, ferry_plan as _, ferry_score as _};

use std::process::Command;
use std::time::Duration;

use ferry_runtime::Topics;
use rdkafka::consumer::{BaseConsumer, Consumer};

#[test]
fn apply_creates_every_topic_once_tansu() {
    if !ferry_runtime::tansu::binary().exists() {
        ferry_runtime::report::missing_prerequisite("tansu is not installed (scripts/install-tansu.sh)");
        return;
    }
    let broker = ferry_runtime::tansu::Tansu::start_empty().unwrap();
    let apply = || {
        Command::new(env!("CARGO_BIN_EXE_ferry"))
            .args(["--brokers", broker.bootstrap(), "topics", "apply", "--replication-factor", "1"])
            .output()
            .unwrap()
    };
    let first = apply();
    let out = String::from_utf8_lossy(&first.stdout).into_owned();
    assert!(first.status.success(), "{out}\n{}", String::from_utf8_lossy(&first.stderr));
    let topics = Topics::standard();
    for t in topics.all() {
        assert!(out.contains(&format!("created  {}", t.name)), "{} not created:\n{out}", t.name);
    }
    let second = apply();
    let out = String::from_utf8_lossy(&second.stdout).into_owned();
    assert!(second.status.success(), "{out}");
    assert!(!out.contains("created"), "a second apply creates nothing:\n{out}");
    // With a policy, its tenants' command topics too.
    let tenants = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/tenants.yaml");
    let with = Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(["--brokers", broker.bootstrap(), "topics", "apply", "--replication-factor", "1", "--policy"])
        .arg(&tenants)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&with.stdout).into_owned();
    assert!(with.status.success(), "{out}\n{}", String::from_utf8_lossy(&with.stderr));
    let policy = ferry_runtime::tenants::Policy::load(&tenants).unwrap();
    let tenant_topics = topics.tenant_topics(&policy);
    assert!(!tenant_topics.is_empty());
    for t in &tenant_topics {
        assert!(out.contains(&format!("created  {}", t.name)), "{} not created:\n{out}", t.name);
    }
    let c: BaseConsumer = broker.kafka().reader().create().unwrap();
    let md = c.fetch_metadata(None, Duration::from_secs(30)).unwrap();
    for t in topics.all() {
        let m = md.topics().iter().find(|m| m.name() == t.name).unwrap_or_else(|| panic!("{} missing", t.name));
        assert_eq!(m.partitions().len() as i32, t.partitions, "{}", t.name);
    }
}
