//! Starts a fleet in a given directory and keeps it for a while, to inspect its logs:
//! `cargo run -p ferry-fleet --example fleet_up -- /tmp/fleet 30`.

use std::time::Duration;

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let dir = args.next().unwrap_or_else(|| "/tmp/ferry-fleet".into());
    let secs: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(30);
    let started = std::time::Instant::now();
    let opts = ferry_fleet::FleetOptions { dir: Some(dir.clone().into()), ..ferry_fleet::FleetOptions::hub_and(2) };
    let fleet = ferry_fleet::Fleet::start(opts).await.unwrap();
    println!("fleet of {} clusters ready in {:?} under {dir}", fleet.clusters.len(), started.elapsed());
    for c in &fleet.clusters {
        println!("{}: {} kubeconfig {}", c.name, c.server, c.kubeconfig.display());
    }
    // Kept alive only for inspection by hand.
    tokio::time::sleep(Duration::from_secs(secs)).await;
}
