//! `ferry topics apply`: creates the topics of `topics/topics.yaml` (with the installation's
//! prefix) with their partitions, replication and configs (compaction for task-state and
//! scores), and with `--policy` its tenants' command topics. Idempotent: existing topics
//! are reported, and their partition count checked.

use std::process::ExitCode;
use std::time::Duration;

use clap::Subcommand;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::types::RDKafkaErrorCode;

use super::common::Conn;

#[derive(Debug, Subcommand)]
pub enum TopicsCommand {
    /// Create every topic that does not exist yet.
    Apply {
        /// Replication factor instead of the definitions' (e.g. 1 on a one-broker Kafka).
        #[arg(long)]
        replication_factor: Option<i32>,
        /// Print what would be created, change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Also the topics of this policy's tenants: their command topics
        /// (`ferry.tenants.<tenant>.<kind>`) and progress topic (`ferry.tenant-progress.<tenant>`).
        #[arg(long, env = "FERRY_POLICY")]
        policy: Option<std::path::PathBuf>,
    },
}

pub async fn run(conn: &Conn, cmd: TopicsCommand) -> anyhow::Result<ExitCode> {
    let TopicsCommand::Apply { replication_factor, dry_run, policy } = cmd;
    conn.check_reachable().await?;
    let kafka = conn.kafka()?;
    let topics = conn.topics();
    let admin: AdminClient<DefaultClientContext> = kafka.client().create()?;
    let md = {
        let admin = &admin;
        tokio::task::block_in_place(|| admin.inner().fetch_metadata(None, Duration::from_secs(30)))?
    };
    let mut problems = 0;
    let mut new = Vec::new();
    let tenants = match &policy {
        Some(p) => topics.tenant_topics(&ferry_runtime::tenants::Policy::load(p)?),
        None => Vec::new(),
    };
    for t in topics.all().iter().chain(&tenants) {
        match md.topics().iter().find(|m| m.name() == t.name && m.error().is_none()) {
            Some(m) if m.partitions().len() as i32 == t.partitions => println!("exists   {} ({} partitions)", t.name, t.partitions),
            Some(m) => {
                problems += 1;
                println!("DIFFERS  {}: {} partitions, topics.yaml says {}", t.name, m.partitions().len(), t.partitions);
            }
            None => new.push(t),
        }
    }
    if dry_run {
        for t in &new {
            let config: Vec<String> = t.config.iter().map(|(k, v)| format!("{k}={v}")).collect();
            println!("would create {} ({} partitions{}{})", t.name, t.partitions, if config.is_empty() { "" } else { ", " }, config.join(", "));
        }
        return Ok(ExitCode::SUCCESS);
    }
    let defs: Vec<NewTopic> = new
        .iter()
        .map(|t| {
            let rf = replication_factor.unwrap_or(t.replication_factor);
            t.config.iter().fold(NewTopic::new(&t.name, t.partitions, TopicReplication::Fixed(rf)), |nt, (k, v)| nt.set(k, v))
        })
        .collect();
    if !defs.is_empty() {
        let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
        for r in admin.create_topics(&defs, &opts).await? {
            match r {
                Ok(name) => println!("created  {name}"),
                Err((name, RDKafkaErrorCode::TopicAlreadyExists)) => println!("exists   {name}"),
                Err((name, code)) => {
                    problems += 1;
                    eprintln!("error: creating {name}: {code}");
                }
            }
        }
    }
    Ok(if problems == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}
