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
        // The pipe is read by a watcher beside the guard, which waits for the program
        // itself: the guard ends when the program does, so `running` tells the program's
        // life. Before, the guard sat in its read until the pipe closed, and a program that
        // had exited looked alive: most likely session 35's red CI, where a test bed waited
        // 240 s on an API server "alive" and refusing every connection (its port taken
        // between `free_port` and its bind, we believe; `fleet.rs`, `ready_or_restarted`).
        let mut guard = Command::new("sh")
            .arg("-c")
            .arg(r#"trap '' INT HUP; exec 3<&0; "$@" </dev/null & child=$!; trap 'kill -9 $child 2>/dev/null; exit' TERM; { while read -r _; do :; done; kill -9 $child 2>/dev/null; } <&3 & watcher=$!; exec 3<&-; wait $child; rc=$?; kill $watcher 2>/dev/null; exit $rc"#)
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

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::time::Duration;

    use super::Managed;

    /// How long a guard may take to end (it ends within milliseconds).
    const LIMIT: Duration = Duration::from_secs(30);

    /// Waits for `m`'s guard to end, at most [`LIMIT`]: its exit code, or `None`.
    fn guard_end(mut m: Managed) -> Option<Option<i32>> {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let status = m.guard.wait().ok().and_then(|s| s.code());
            let _ = tx.send(status);
        });
        rx.recv_timeout(LIMIT).ok()
    }

    #[test]
    fn the_guard_ends_with_its_program() {
        let dir = tempfile::tempdir().unwrap();
        let m = Managed::spawn("exits", Path::new("sh"), &["-c".into(), "exit 3".into()], &dir.path().join("log")).unwrap();
        assert_eq!(guard_end(m), Some(Some(3)), "the guard outlived its program (pipe still open)");
    }

    #[test]
    fn closing_the_pipe_stops_the_program() {
        let dir = tempfile::tempdir().unwrap();
        let mut m = Managed::spawn("sleeps", Path::new("sleep"), &["600".into()], &dir.path().join("log")).unwrap();
        assert!(m.running());
        m.begin_stop();
        assert!(guard_end(m).is_some(), "the program was not stopped when the pipe closed");
    }
}
