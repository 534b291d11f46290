//! Figures: percentiles, a process's CPU time and memory, the machine.

/// The `p`-th percentile of sorted figures (NaN for none).
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let i = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Mean, p50, p99, p99.9 and max of some figures.
pub struct Summary {
    /// Mean.
    pub mean: f64,
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Largest.
    pub max: f64,
}

/// Summarises figures.
pub fn summary(mut ms: Vec<f64>) -> Summary {
    ms.sort_by(f64::total_cmp);
    #[allow(clippy::cast_precision_loss)]
    let mean = ms.iter().sum::<f64>() / ms.len().max(1) as f64;
    Summary {
        mean,
        p50: percentile(&ms, 50.0),
        p99: percentile(&ms, 99.0),
        p999: percentile(&ms, 99.9),
        max: ms.last().copied().unwrap_or(f64::NAN),
    }
}

/// A `/proc/<pid>/status` figure in KiB (`VmRSS:`, `VmHWM:`).
pub fn proc_status(pid: u32, key: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with(key))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// utime + stime of a process, seconds.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    #[allow(clippy::cast_precision_loss)]
    Some(ticks as f64 / hz.max(1) as f64)
}

/// The machine in one line: cores, CPU model, memory.
pub fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default();
    let gib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .next()
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|k| k.parse::<u64>().ok())
        })
        .map_or(0, |kib| kib / 1024 / 1024);
    format!(
        "{} cores ({cpu}), {gib} GiB",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
    )
}
