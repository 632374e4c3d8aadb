//! Measures a fleet: time to start, and resident memory of its processes by program,
//! read from /proc (processes whose command line names the fleet's directory).

use std::collections::BTreeMap;
use std::path::Path;

/// RSS in MiB by program name (etcd, kube-apiserver, ...), summed over processes.
pub fn rss_by_program(fleet_dir: &Path) -> BTreeMap<String, (usize, f64)> {
    let needle = fleet_dir.display().to_string();
    let mut out: BTreeMap<String, (usize, f64)> = BTreeMap::new();
    let Ok(procs) = std::fs::read_dir("/proc") else { return out };
    for p in procs.flatten() {
        let dir = p.path();
        let Ok(cmd) = std::fs::read(dir.join("cmdline")) else { continue };
        let args: Vec<String> = cmd.split(|b| *b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
        let Some(program) = args.first().and_then(|a| Path::new(a).file_name()).map(|n| n.to_string_lossy().into_owned()) else { continue };
        if program == "sh" || !args.iter().any(|a| a.contains(&needle)) {
            continue;
        }
        let Ok(status) = std::fs::read_to_string(dir.join("status")) else { continue };
        let kb: f64 = status
            .lines()
            .find(|l| l.starts_with("VmRSS:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        let e = out.entry(program).or_default();
        e.0 += 1;
        e.1 += kb / 1024.0;
    }
    out
}
