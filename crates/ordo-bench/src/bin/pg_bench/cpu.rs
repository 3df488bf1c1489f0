//! The cores a phase used: `ordo serve`'s and this process's (by thread, from
//! /proc), and the whole machine's, so that a figure taken on a shared machine
//! says how much of it the processes measured had.

use std::time::Instant;

use ordo_bench::live::procfs::{machine_cpu_seconds, CpuSample};

/// The counters at a phase's start.
pub struct PhaseCpu {
    ordo_pid: String,
    ordo: Option<CpuSample>,
    own: Option<CpuSample>,
    machine: Option<(f64, f64)>,
    started: Instant,
}

/// What the phase used, as text for the report.
pub struct CpuUse {
    pub ordo: String,
    pub own: String,
    pub machine: String,
}

impl PhaseCpu {
    pub fn start(ordo_pid: &str) -> PhaseCpu {
        PhaseCpu {
            ordo_pid: ordo_pid.to_owned(),
            ordo: CpuSample::read(ordo_pid),
            own: CpuSample::read("self"),
            machine: machine_cpu_seconds(),
            started: Instant::now(),
        }
    }

    pub fn finish(self) -> CpuUse {
        let seconds = self.started.elapsed().as_secs_f64();
        let cores = |before: Option<CpuSample>, pid: &str| {
            let after = CpuSample::read(pid);
            before
                .zip(after)
                .map_or_else(|| "? cores".to_owned(), |(before, after)| after.cores_since(&before, seconds))
        };
        let machine = self.machine.zip(machine_cpu_seconds()).map_or_else(
            || "?".to_owned(),
            |((busy_before, steal_before), (busy, steal))| {
                let n_cores = std::thread::available_parallelism().map_or(0, usize::from);
                format!(
                    "{:.2} of {n_cores} cores busy, {:.2} stolen",
                    (busy - busy_before) / seconds,
                    (steal - steal_before) / seconds
                )
            },
        );
        CpuUse { ordo: cores(self.ordo, &self.ordo_pid), own: cores(self.own, "self"), machine }
    }
}
