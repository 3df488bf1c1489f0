//! What the store's background threads share: they run below the writer's
//! priority (the checkpointer, the spare log segment's writer), since every
//! write waits on the writer thread and on none of them.

/// Raises the calling thread's nice value to `nice` (a lower priority); best
/// effort, as a refusal only means the thread competes for CPU as before.
pub(crate) fn lower_priority(nice: i32) {
    if nice == 0 {
        return;
    }
    // SAFETY: `setpriority` reads only its integer arguments. On Linux, `who = 0`
    // with `PRIO_PROCESS` names the calling thread alone (each thread has its own
    // nice value), which `checkpointer_runs_at_its_nice_value...` in
    // `tests/log.rs` checks.
    unsafe {
        libc::setpriority(libc::PRIO_PROCESS, 0, nice);
    }
}
