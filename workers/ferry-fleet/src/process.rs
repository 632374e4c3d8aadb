//! Child processes that stop with their owner: on drop, and also when the owning process
//! is killed (each runs under a `sh` guard that kills it when our stdin pipe closes).

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};

/// A free loopback port (bound, then released for the child to take).
pub fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// A running child process with its log file.
#[derive(Debug)]
pub struct Managed {
    name: String,
    guard: Child,
    stdin: Option<ChildStdin>,
}

impl Managed {
    /// Starts `program args` with stdout and stderr appended to `log`.
    pub fn spawn(name: &str, program: &Path, args: &[String], log: &Path) -> std::io::Result<Self> {
        let out = std::fs::OpenOptions::new().create(true).append(true).open(log)?;
        let err = out.try_clone()?;
        // The guard starts the program, then blocks reading our pipe; when the pipe closes
        // (we dropped it, or we died) it kills the program and waits for it.
        let mut guard = Command::new("sh")
            .arg("-c")
            .arg(r#""$@" </dev/null & child=$!; trap 'kill $child 2>/dev/null' TERM; while read -r _; do :; done; kill $child 2>/dev/null; wait $child"#)
            .arg("sh")
            .arg(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(out)
            .stderr(err)
            .spawn()?;
        let stdin = guard.stdin.take();
        Ok(Self { name: name.to_owned(), guard, stdin })
    }

    /// The process's name in logs.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// True while the guarded program runs.
    pub fn running(&mut self) -> bool {
        matches!(self.guard.try_wait(), Ok(None))
    }
}

impl Drop for Managed {
    fn drop(&mut self) {
        // Closing the pipe makes the guard kill the program; then reap the guard.
        self.stdin.take();
        let _ = self.guard.wait();
    }
}
