//! `cluster-bench`: cluster mode's figures (docs/BENCHMARKS.md, "Cluster mode");
//! the phases and their options are in `ordo_bench::cluster_bench`.

fn main() {
    ordo_bench::cluster_bench::main();
}
