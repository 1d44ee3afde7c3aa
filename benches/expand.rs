//! Expanding a matrix with a 10^5-entry product.

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use fraglink::build::matrix::expand;
use serde_json::{Map, Value};

/// Five dimensions of ten string values each: 10^5 entries.
fn matrix() -> Value {
    let dims: Map<String, Value> = ["data_type", "idx_type", "metric", "veclen", "filter"]
        .iter()
        .map(|dim| {
            let values = (0..10)
                .map(|i| Value::String(format!("{dim}_{i}")))
                .collect();
            ((*dim).to_owned(), Value::Array(values))
        })
        .collect();
    Value::Object(dims)
}

fn bench_expand(c: &mut Criterion) {
    let matrix = matrix();
    let product = expand(&matrix).expect("matrix expands");
    assert_eq!(product.entries.len(), 100_000);
    assert!(product.warnings.is_empty());

    let mut group = c.benchmark_group("expand");
    group.throughput(Throughput::Elements(100_000));
    group.sample_size(20);
    group.bench_function("5x10_dims_100k_entries", |b| {
        b.iter(|| expand(black_box(&matrix)).expect("matrix expands"))
    });
    group.finish();
}

criterion_group!(benches, bench_expand);
criterion_main!(benches);
