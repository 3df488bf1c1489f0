//! Process and machine CPU time and memory, from /proc.

use std::fmt::Write as _;

/// `(name, user plus system CPU seconds)` from a /proc `stat` file (of a process
/// or of one of its threads).
pub fn stat_cpu_seconds(stat_path: &str) -> Option<(String, f64)> {
    let stat = std::fs::read_to_string(stat_path).ok()?;
    // The command name (field 2) may hold spaces and parentheses: it runs from
    // the first '(' to the last ')'. After it come field 3 (state) onwards;
    // utime and stime are fields 14 and 15.
    let name_end = stat.rfind(')')?;
    let name = stat.get(stat.find('(')? + 1..name_end)?.to_string();
    let mut fields = stat.get(name_end + 1..)?.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    // SAFETY: sysconf only reads a configuration value.
    let ticks_per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks_per_second <= 0 {
        return None;
    }
    Some((name, (utime + stime) as f64 / ticks_per_second as f64))
}

/// A process's CPU time (`pid` or "self"), in total and by thread name (threads
/// of one name summed: a runtime's workers share theirs), so that a report can
/// say which thread of the server is the busy one.
pub struct CpuSample {
    pub total_seconds: f64,
    pub by_thread_seconds: Vec<(String, f64)>,
}

impl CpuSample {
    pub fn read(pid: &str) -> Option<CpuSample> {
        let (_, total_seconds) = stat_cpu_seconds(&format!("/proc/{pid}/stat"))?;
        let mut by_thread_seconds: Vec<(String, f64)> = Vec::new();
        for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()?.flatten() {
            let Some((name, seconds)) = stat_cpu_seconds(&format!("{}/stat", task.path().display())) else {
                continue; // the thread ended meanwhile
            };
            match by_thread_seconds.iter_mut().find(|(known, _)| *known == name) {
                Some((_, sum)) => *sum += seconds,
                None => by_thread_seconds.push((name, seconds)),
            }
        }
        Some(CpuSample { total_seconds, by_thread_seconds })
    }

    /// `cores (name cores, ...)` used from `before` to `self` over `wall_seconds`.
    pub fn cores_since(&self, before: &CpuSample, wall_seconds: f64) -> String {
        let mut text = format!("{:.2} cores", (self.total_seconds - before.total_seconds) / wall_seconds);
        let mut threads: Vec<(&str, f64)> = self
            .by_thread_seconds
            .iter()
            .map(|(name, seconds)| {
                let earlier = before.by_thread_seconds.iter().find(|(known, _)| known == name).map_or(0.0, |t| t.1);
                (name.as_str(), (seconds - earlier) / wall_seconds)
            })
            .filter(|(_, cores)| *cores >= 0.005)
            .collect();
        threads.sort_by(|a, b| b.1.total_cmp(&a.1));
        if !threads.is_empty() {
            let parts: Vec<String> = threads.iter().map(|(name, cores)| format!("{name} {cores:.2}")).collect();
            write!(text, " ({})", parts.join(", ")).expect("writing to a String");
        }
        text
    }
}

/// `VmRSS` and `VmHWM` (peak RSS) in bytes, from /proc/<pid>/status.
pub fn memory_bytes(pid: &str) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| -> Option<u64> {
        let line = status.lines().find(|line| line.starts_with(name))?;
        let kib: u64 = line[name.len()..].trim().trim_end_matches("kB").trim().parse().ok()?;
        Some(kib * 1024)
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

/// 1 000+ sockets need more descriptors than the usual soft limit of 1 024; the
/// hard limit is ours to take. The server, started afterwards, inherits it.
pub fn raise_open_files_limit() -> u64 {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit and setrlimit only read and write the struct passed.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return 0;
        }
        if limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit { rlim_cur: limit.rlim_max, rlim_max: limit.rlim_max };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                limit = raised;
            }
        }
    }
    limit.rlim_cur
}

/// `(busy, steal)` CPU seconds of all cores together since boot, from
/// /proc/stat's `cpu` line (busy: user, nice, system, irq, softirq; guest
/// time is inside user).
pub fn machine_cpu_seconds() -> Option<(f64, f64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let ticks: Vec<u64> = stat
        .lines()
        .next()?
        .strip_prefix("cpu ")?
        .split_whitespace()
        .map(|field| field.parse().ok())
        .collect::<Option<_>>()?;
    let (user, nice, system, irq, softirq, steal) =
        (*ticks.first()?, *ticks.get(1)?, *ticks.get(2)?, *ticks.get(5)?, *ticks.get(6)?, *ticks.get(7)?);
    // SAFETY: sysconf only reads a configuration value.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if per_second <= 0 {
        return None;
    }
    let seconds = |ticks: u64| ticks as f64 / per_second as f64;
    Some((seconds(user + nice + system + irq + softirq), seconds(steal)))
}
