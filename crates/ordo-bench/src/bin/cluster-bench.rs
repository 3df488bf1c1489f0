//! `cluster-bench`: the figures of issue 16 (docs/BENCHMARKS.md, "Cluster");
//! the phases and their options are in `ordo_bench::cluster_bench`.

fn main() {
    ordo_bench::cluster_bench::main();
}
