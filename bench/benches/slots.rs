//! Criterion benchmark of computing the slot table (owners and successors of every slot) for
//! 10, 100 and 1,000 members: every membership change pays it once.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use floodgate::cluster::SlotTable;

fn members(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| format!("10.0.{}.{}:7400", i / 250, i % 250))
        .collect()
}

fn slot_table(c: &mut Criterion) {
    let mut group = c.benchmark_group("slot_table_compute");
    for n in [10, 100, 1_000] {
        let ids = members(n);
        group.bench_with_input(BenchmarkId::from_parameter(n), &ids, |b, ids| {
            b.iter(|| SlotTable::compute(1, black_box(ids)))
        });
    }
    group.finish();
}

criterion_group!(benches, slot_table);
criterion_main!(benches);
