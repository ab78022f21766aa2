//! The process's resources as the operating system counts them, for the standard `process_*`
//! metrics (the names Prometheus's client libraries export, so that dashboards made for them work):
//! read from `/proc` at each scrape, never on the request path.

/// One reading of the process's resources.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct ProcessStats {
    /// User and system CPU time, seconds.
    pub(crate) cpu_seconds: f64,
    pub(crate) resident_bytes: u64,
    pub(crate) virtual_bytes: u64,
    pub(crate) open_fds: u64,
    /// The soft limit on open descriptors (`ulimit -n`).
    pub(crate) max_fds: u64,
}

/// Linux's `USER_HZ`, the unit of `/proc/self/stat`'s CPU times: 100 on every architecture Linux
/// runs on (the kernel scales its own tick rate to it), and reading `sysconf` would take `unsafe`.
const TICKS_PER_SECOND: f64 = 100.0;

/// This process's resources now; `None` where `/proc` cannot be read (not Linux): the families are
/// then written without samples, never with made-up ones.
pub(crate) fn read() -> Option<ProcessStats> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let open_fds = std::fs::read_dir("/proc/self/fd").ok()?.count() as u64;
    parse(&stat, &status, &limits, open_fds)
}

/// The reading from the text of `/proc/self/stat`, `/proc/self/status` and `/proc/self/limits`.
fn parse(stat: &str, status: &str, limits: &str, open_fds: u64) -> Option<ProcessStats> {
    // The command name (field 2) is in parentheses and may hold spaces: fields are counted after
    // its closing parenthesis, from field 3 (`state`).
    let after_name = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks = |field: usize| fields.get(field - 3)?.parse::<u64>().ok();
    let cpu_seconds = (ticks(14)? + ticks(15)?) as f64 / TICKS_PER_SECOND;
    let kilobytes = |key: &str| {
        let line = status.lines().find(|line| line.starts_with(key))?;
        let value = line[key.len()..].trim().trim_end_matches("kB").trim();
        value.parse::<u64>().ok().map(|kb| kb * 1024)
    };
    let max_fds = limits
        .lines()
        .find(|line| line.starts_with("Max open files"))?
        .split_whitespace()
        .nth(3)?;
    Some(ProcessStats {
        cpu_seconds,
        resident_bytes: kilobytes("VmRSS:")?,
        virtual_bytes: kilobytes("VmSize:")?,
        open_fds,
        // `unlimited` has no number: the largest there is.
        max_fds: max_fds.parse().unwrap_or(u64::MAX),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_text_is_read_field_by_field_a_command_name_with_spaces_and_parentheses_included() {
        let stat = "4242 (duet (w) 1) S 1 4242 4242 0 -1 4194560 1000 0 0 0 250 75 0 0 20 0 3 0 \
                    12345 1000000 2000 18446744073709551615";
        let status = "Name:\tduet\nVmSize:\t  123456 kB\nVmRSS:\t    2048 kB\nThreads:\t3\n";
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max cpu time              unlimited            unlimited            seconds\n\
                      Max open files            1024                 524288               files\n";
        assert_eq!(
            parse(stat, status, limits, 17),
            Some(ProcessStats {
                cpu_seconds: 3.25,
                resident_bytes: 2048 * 1024,
                virtual_bytes: 123_456 * 1024,
                open_fds: 17,
                max_fds: 1024,
            })
        );
        assert_eq!(parse("no parenthesis", status, limits, 1), None);
    }

    #[test]
    fn this_process_is_read_on_linux() {
        if !cfg!(target_os = "linux") {
            return;
        }
        let stats = read().expect("/proc/self");
        assert!(stats.resident_bytes > 0 && stats.virtual_bytes >= stats.resident_bytes);
        assert!(
            stats.open_fds > 0 && stats.max_fds >= stats.open_fds,
            "{stats:?}"
        );
    }
}
