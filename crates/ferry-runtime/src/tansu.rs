//! A tansu broker process (a Kafka-compatible broker in Rust) on a free loopback port,
//! with Ferry's topics created through the admin API. Used by tests and `ferry bench`;
//! `scripts/install-tansu.sh` builds the binary into the cache once.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::KafkaError;

use crate::kafka::KafkaConfig;
use crate::topics::Topics;

/// Why tansu could not be started.
#[derive(Debug, thiserror::Error)]
pub enum TansuError {
    /// The binary is not in the cache.
    #[error("tansu is not installed at {0}: run scripts/install-tansu.sh")]
    NotInstalled(PathBuf),
    /// The process did not start.
    #[error("starting {path}: {source}")]
    Spawn {
        /// The binary.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// A user could not be created.
    #[error("creating SASL user {user} on tansu: {reason}")]
    CreateUser {
        /// The user.
        user: String,
        /// What the CLI said.
        reason: String,
    },
    /// Topics could not be created.
    #[error("creating topic {topic} on tansu: {source}")]
    CreateTopic {
        /// The topic.
        topic: String,
        /// Cause.
        #[source]
        source: KafkaError,
    },
}

/// The tansu binary: `FERRY_TANSU`, else the install script's cache.
pub fn binary() -> PathBuf {
    if let Some(p) = std::env::var_os("FERRY_TANSU") {
        return PathBuf::from(p);
    }
    let cache = std::env::var_os("FERRY_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/ferry"));
    // Built with the libsql engine too: the SASL test needs users that outlive a restart.
    cache.join("tansu-0.6.0-sql-o1/bin/tansu")
}

/// A running tansu broker, killed on drop.
#[derive(Debug)]
pub struct Tansu {
    child: Child,
    bootstrap: String,
    _dir: Option<tempfile::TempDir>,
}

fn free_port() -> Result<u16, TansuError> {
    let spawn_err = |source| TansuError::Spawn { path: binary(), source };
    Ok(TcpListener::bind("127.0.0.1:0").map_err(spawn_err)?.local_addr().map_err(spawn_err)?.port())
}

/// Starts the broker on `port` with `storage` (relative paths from `dir`).
fn spawn(port: u16, storage: &str, dir: Option<&std::path::Path>, authentication: bool) -> Result<Child, TansuError> {
    let path = binary();
    if !path.exists() {
        return Err(TansuError::NotInstalled(path));
    }
    // 127.0.0.1 for both: `localhost` may resolve to ::1 (TESTBED.md).
    let url = format!("tcp://127.0.0.1:{port}");
    let mut cmd = Command::new(&path);
    cmd.args(["broker", "--listener-url", &url, "--advertised-listener-url", &url, "--storage-engine", storage]);
    if authentication {
        cmd.arg("--authentication");
    }
    if let Some(d) = dir {
        cmd.current_dir(d);
    }
    cmd.stdout(Stdio::null()).stderr(Stdio::null()).spawn().map_err(|source| TansuError::Spawn { path, source })
}

impl Drop for Tansu {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Tansu {
    /// Starts tansu with in-memory storage and creates every topic of `topics`.
    pub async fn start(topics: &Topics) -> Result<Self, TansuError> {
        let port = free_port()?;
        let child = spawn(port, "memory://tansu/", None, false)?;
        let t = Self { child, bootstrap: format!("127.0.0.1:{port}"), _dir: None };
        t.create_topics(topics).await?;
        Ok(t)
    }

    /// Starts tansu with in-memory storage and no topics.
    pub fn start_empty() -> Result<Self, TansuError> {
        let port = free_port()?;
        Ok(Self { child: spawn(port, "memory://tansu/", None, false)?, bootstrap: format!("127.0.0.1:{port}"), _dir: None })
    }

    /// Starts tansu requiring SASL authentication (SCRAM-SHA-512) of `users` (name,
    /// password), with every topic of `topics`. Users and topics are created before
    /// authentication is switched on, in a SQLite store that survives the restart.
    pub async fn start_secured(topics: &Topics, users: &[(&str, &str)]) -> Result<Self, TansuError> {
        Self::start_secured_with(topics, &[], users).await
    }

    /// [`Self::start_secured`], with `extra` topics too (e.g. tenants' command topics).
    pub async fn start_secured_with(topics: &Topics, extra: &[crate::topics::TopicDef], users: &[(&str, &str)]) -> Result<Self, TansuError> {
        let path = binary();
        let dir = tempfile::tempdir().map_err(|source| TansuError::Spawn { path: path.clone(), source })?;
        let port = free_port()?;
        let open = Self { child: spawn(port, "sqlite://tansu.db", Some(dir.path()), false)?, bootstrap: format!("127.0.0.1:{port}"), _dir: None };
        open.create_topics(topics).await?;
        for t in extra {
            open.create_topic(&t.name, t.partitions).await?;
        }
        for (user, password) in users {
            let out = Command::new(&path)
                .args(["user", "create", "--broker", &format!("tcp://127.0.0.1:{port}"), "--mechanism", "scram512", user, password])
                .output()
                .map_err(|source| TansuError::Spawn { path: path.clone(), source })?;
            if !out.status.success() {
                // The CLI's output names the user, never the password.
                return Err(TansuError::CreateUser { user: (*user).to_owned(), reason: String::from_utf8_lossy(&out.stderr).trim().to_owned() });
            }
        }
        drop(open);
        let port = free_port()?;
        let child = spawn(port, "sqlite://tansu.db", Some(dir.path()), true)?;
        Ok(Self { child, bootstrap: format!("127.0.0.1:{port}"), _dir: Some(dir) })
    }

    /// The bootstrap address.
    pub fn bootstrap(&self) -> &str {
        &self.bootstrap
    }

    /// Client settings for this broker.
    pub fn kafka(&self) -> KafkaConfig {
        KafkaConfig::plaintext(self.bootstrap.clone())
    }

    /// Creates `name` with `partitions` (replication 1).
    pub async fn create_topic(&self, name: &str, partitions: i32) -> Result<(), TansuError> {
        let admin: AdminClient<DefaultClientContext> = self
            .kafka()
            .client()
            .create()
            .map_err(|source| TansuError::CreateTopic { topic: name.to_owned(), source })?;
        // The admin client retries its connection until tansu listens (it starts in ms).
        let opts = AdminOptions::new()
            .operation_timeout(Some(Duration::from_secs(30)))
            .request_timeout(Some(Duration::from_secs(30)));
        let results = admin
            .create_topics(&[NewTopic::new(name, partitions, TopicReplication::Fixed(1))], &opts)
            .await
            .map_err(|source| TansuError::CreateTopic { topic: name.to_owned(), source })?;
        for r in results {
            if let Err((topic, code)) = r {
                return Err(TansuError::CreateTopic { topic, source: KafkaError::AdminOp(code) });
            }
        }
        Ok(())
    }

    async fn create_topics(&self, topics: &Topics) -> Result<(), TansuError> {
        for d in topics.all() {
            self.create_topic(&d.name, d.partitions).await?;
        }
        Ok(())
    }
}
