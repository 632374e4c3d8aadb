//! `ferry apps list [--owner X]`: the apps the deploy worker runs, derived from the
//! task-state topic alone: per app (`<namespace>/<name>`), the last succeeded deploy or
//! update that no later succeeded delete removed (reverted tasks changed nothing).

use std::collections::BTreeMap;
use std::process::ExitCode;

use clap::Subcommand;
use ferry_deploy::spec::{DeployApp, DeployOperation};
use ferry_runtime::{TaskKind, TaskSnapshot};
use serde::Serialize;

use super::common::{Conn, Output};

#[derive(Debug, Subcommand)]
pub enum AppsCommand {
    /// Apps deployed now, from the task state.
    List {
        /// Only this owner's apps.
        #[arg(long)]
        owner: Option<String>,
        #[arg(short, long, value_enum, default_value_t)]
        output: Output,
    },
}

/// One app as the task state tells it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct AppView {
    /// `<namespace>/<name>`.
    pub app: String,
    /// Its owner.
    pub owner: String,
    /// Component names.
    pub components: Vec<String>,
    /// Where its components run.
    pub clusters: Vec<String>,
    /// The task that made it so.
    pub task_id: String,
    /// When that task finished (ms since the epoch).
    pub updated_at_ms: i64,
    /// The same, RFC 3339.
    pub updated_at: Option<String>,
}

/// The apps in `snapshots` (deploy tasks; others are ignored).
pub fn apps(registry: &ferry_runtime::wire::Registry, snapshots: &[TaskSnapshot]) -> Vec<AppView> {
    let mut live: BTreeMap<String, AppView> = BTreeMap::new();
    for (s, spec) in super::fleet_view::replay::<DeployApp>(registry, snapshots, TaskKind::DEPLOY) {
        if spec.operation == DeployOperation::Delete {
            live.remove(&s.subject);
            continue;
        }
        let mut clusters: Vec<String> =
            ferry_deploy::outputs::WAIT.from_snapshot(s).map(|w| w.components.into_iter().map(|c| c.cluster).collect()).unwrap_or_default();
        clusters.sort();
        clusters.dedup();
        live.insert(
            s.subject.clone(),
            AppView {
                app: s.subject.clone(),
                owner: spec.owner.clone(),
                components: spec.components.iter().map(|c| c.name.clone()).collect(),
                clusters,
                task_id: s.task_id.clone(),
                updated_at_ms: s.updated_at_ms,
                updated_at: super::table::rfc3339(s.updated_at_ms),
            },
        );
    }
    live.into_values().collect()
}

pub async fn run(conn: &Conn, cmd: AppsCommand) -> anyhow::Result<ExitCode> {
    let client = conn.command_client().await?;
    match cmd {
        AppsCommand::List { owner, output } => {
            let mut views = apps(client.registry(), &client.snapshots().await?);
            views.retain(|v| owner.as_ref().is_none_or(|o| &v.owner == o));
            match output {
                Output::Json => println!("{}", serde_json::to_string_pretty(&views)?),
                Output::Yaml => print!("{}", serde_yaml_ng::to_string(&views)?),
                Output::Table if views.is_empty() => eprintln!("No apps found."),
                Output::Table => {
                    let now = ferry_runtime::protocol::now_ms();
                    let mut t = super::table::table(["APP", "OWNER", "COMPONENTS", "CLUSTERS", "TASK", "AGE"]);
                    for v in &views {
                        t.add_row([v.app.clone(), v.owner.clone(), v.components.join(","), v.clusters.join(","), v.task_id.clone(), super::table::age(now, v.updated_at_ms)]);
                    }
                    super::table::print(t);
                }
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_runtime::TaskState;
    use ferry_runtime::wire::Registry;

    fn snap(r: &Registry, n: i64, op: DeployOperation, name: &str, owner: &str, state: TaskState) -> TaskSnapshot {
        let spec = DeployApp { operation: op, name: name.into(), owner: owner.into(), ..DeployApp::default() };
        crate::cli::fleet_view::tests::snap(r, n, TaskKind::DEPLOY, &spec.subject(), &spec, state, Vec::new())
    }

    #[test]
    fn deletes_remove_and_reverted_tasks_change_nothing() {
        let r = Registry::embedded();
        let all = vec![
            snap(&r, 1, DeployOperation::Deploy, "shop", "team-a", TaskState::Succeeded),
            snap(&r, 2, DeployOperation::Deploy, "blog", "team-b", TaskState::Succeeded),
            snap(&r, 3, DeployOperation::Update, "shop", "team-x", TaskState::Reverted),
            snap(&r, 4, DeployOperation::Delete, "blog", "", TaskState::Succeeded),
            snap(&r, 5, DeployOperation::Deploy, "wiki", "team-a", TaskState::Reverted),
        ];
        let views = apps(&r, &all);
        let got: Vec<(&str, &str, &str)> = views.iter().map(|v| (v.app.as_str(), v.owner.as_str(), v.task_id.as_str())).collect();
        assert_eq!(got, [("shop/shop", "team-a", "tsk_1")]);
    }
}
