//! The scoring policies over a large fleet: `cargo bench -p ferry-score --bench policies`

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use ferry_score::policy::{self, Bounds, ClusterLoad, Demand, NodeLoad};

fn fleet(clusters: usize, nodes: usize) -> Vec<ClusterLoad> {
    (0..clusters)
        .map(|c| ClusterLoad {
            cluster: format!("c-{c}"),
            nodes: (0..nodes)
                .map(|n| NodeLoad {
                    name: format!("n-{n}"),
                    excluded: (n % 10 == 0).then(|| "unschedulable".into()),
                    cpu_allocatable: 8_000,
                    mem_allocatable: 32 << 30,
                    cpu_requested: ((c * 7 + n * 13) % 8_000) as i64,
                    mem_requested: (((c * 11 + n * 5) % 32) as i64) << 30,
                })
                .collect(),
        })
        .collect()
}

fn policies(c: &mut Criterion) {
    let loads = fleet(1000, 50);
    let d = Demand { cpu: 500, mem: 1 << 30, replicas: 20 };
    c.bench_function("resource-usage, 1000 clusters x 50 nodes", |b| {
        b.iter(|| policy::rank(black_box(&loads).iter().map(|l| policy::resource_usage(l, Bounds::default())).collect()))
    });
    c.bench_function("worst-fit, 1000 clusters x 50 nodes", |b| b.iter(|| policy::rank(policy::worst_fit(black_box(&loads), d))));
}

criterion_group!(benches, policies);
criterion_main!(benches);
