//! `benches/hive.rs` with mimalloc, the allocator of the processes that run a cloud
//! (src/alloc.rs): the same benchmarks and the same per-message work. `hive` itself keeps the
//! system's malloc, as an edge does.
//!
//! Run: `cargo bench -p edgehive-actors --bench hive_mimalloc`. Figures go to BENCHMARKS.md.

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

// Its `main` is this file's below; only its benchmark group is used.
#[allow(dead_code)]
#[path = "hive.rs"]
mod hive;

criterion::criterion_main!(hive::benches);
