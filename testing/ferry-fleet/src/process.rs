//! Child processes that stop with their owner: on drop, and also when the owning process
//! is killed (each runs under a `sh` guard that kills it when our stdin pipe closes).

use std::net::TcpListener;
use std::os::unix::process::CommandExt;
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
        // (we dropped it, or we died) it kills the program (SIGKILL: a test bed keeps no
        // state worth a graceful stop, and API servers take a minute to drain watches) and
        // waits for it. It has its own
        // process group and ignores INT and HUP: a Ctrl-C or `timeout` signalling our group
        // must not kill the guard and orphan the program; our graceful stop closes the pipe.
        let mut guard = Command::new("sh")
            .arg("-c")
            .arg(r#"trap '' INT HUP; "$@" </dev/null & child=$!; trap 'kill -9 $child 2>/dev/null; exit' TERM; while read -r _; do :; done; kill -9 $child 2>/dev/null; wait $child"#)
            .process_group(0)
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

    /// Asks the guard to stop the program, without waiting (stop many, then wait for all).
    pub fn begin_stop(&mut self) {
        self.stdin.take();
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
