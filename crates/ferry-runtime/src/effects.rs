//! An effect log outside Kafka: the `test` kind's steps append a line to a file when a run
//! of a step starts and when it ends (`ferry worker test --effects FILE`), so a test sees
//! what really ran, whatever the progress events say: a step run again after a crash, or
//! two workers running one task at once.

use std::io::Write;
use std::path::{Path, PathBuf};

/// Where a line stands in a step's run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// The run began (before any work).
    Start,
    /// The run ended (its result is known, success or failure).
    End,
}

/// One line of the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Effect {
    /// The task.
    pub task: String,
    /// The step, from 1.
    pub step: i32,
    /// The worker that ran it.
    pub worker: String,
    /// Start or end.
    pub phase: Phase,
    /// Wall clock, microseconds since the epoch (one machine's clock in tests).
    pub at_us: i64,
}

/// Why the log could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum EffectError {
    /// The file could not be opened, written or read.
    #[error("effect log {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// A line is not `task step worker start|end at_us`.
    #[error("effect log {path}, line {line}: not `task step worker start|end at_us`: {text:?}")]
    Malformed {
        /// The file.
        path: PathBuf,
        /// Line number from 1.
        line: usize,
        /// The line.
        text: String,
    },
}

/// Appends effects of one worker to a file shared by any number of processes.
#[derive(Debug, Clone)]
pub struct EffectLog {
    path: PathBuf,
    worker: String,
}

impl EffectLog {
    /// Effects of `worker`, appended to `path` (created when missing).
    pub fn new(path: impl Into<PathBuf>, worker: impl Into<String>) -> Self {
        Self { path: path.into(), worker: worker.into() }
    }

    /// Appends one line. The file is opened in append mode and the line written with one
    /// call, so lines of concurrent writers (threads or processes) never interleave.
    pub fn record(&self, task: &str, step: i32, phase: Phase) -> Result<(), EffectError> {
        let at_us = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_micros() as i64);
        let phase = match phase {
            Phase::Start => "start",
            Phase::End => "end",
        };
        let line = format!("{task} {step} {} {phase} {at_us}\n", self.worker);
        let io = |source| EffectError::Io { path: self.path.clone(), source };
        let mut f = std::fs::OpenOptions::new().create(true).append(true).open(&self.path).map_err(io)?;
        f.write_all(line.as_bytes()).map_err(io)
    }

    /// Every line of the log at `path`, in file order (none when it does not exist).
    pub fn read(path: &Path) -> Result<Vec<Effect>, EffectError> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => return Err(EffectError::Io { path: path.to_owned(), source }),
        };
        text.lines()
            .enumerate()
            .map(|(i, l)| {
                let bad = || EffectError::Malformed { path: path.to_owned(), line: i + 1, text: l.to_owned() };
                let f: Vec<&str> = l.split(' ').collect();
                let [task, step, worker, phase, at] = f[..] else { return Err(bad()) };
                let phase = match phase {
                    "start" => Phase::Start,
                    "end" => Phase::End,
                    _ => return Err(bad()),
                };
                Ok(Effect {
                    task: task.to_owned(),
                    step: step.parse().map_err(|_| bad())?,
                    worker: worker.to_owned(),
                    phase,
                    at_us: at.parse().map_err(|_| bad())?,
                })
            })
            .collect()
    }
}

/// How many step runs were a second (or later) run of their step: runs again after a
/// crash, a takeover or a stop; each is a repeated effect a real step must tolerate.
pub fn reruns(effects: &[Effect]) -> usize {
    let mut seen = std::collections::HashSet::new();
    effects.iter().filter(|e| e.phase == Phase::Start && !seen.insert((e.task.as_str(), e.step))).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_written_by_many_threads_read_back_whole() {
        let dir = std::env::temp_dir().join(format!("ferry-effects-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("log");
        let _ = std::fs::remove_file(&path);
        std::thread::scope(|s| {
            for w in 0..4 {
                let log = EffectLog::new(&path, format!("w{w}"));
                s.spawn(move || {
                    for i in 0..50 {
                        log.record(&format!("t{i}"), 1, Phase::Start).unwrap();
                        log.record(&format!("t{i}"), 1, Phase::End).unwrap();
                    }
                });
            }
        });
        let effects = EffectLog::read(&path).unwrap();
        assert_eq!(effects.len(), 400);
        assert_eq!(reruns(&effects), 150, "each of 50 steps ran 4 times");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
