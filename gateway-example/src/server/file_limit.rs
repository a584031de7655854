//! The process's open-file limit: raised to the hard limit at start, and a warning when
//! `max_connections` would not fit under it (each connection is one file).

use std::io;

/// Raises the soft open-file limit to the hard one, where the system allows it, so that
/// `max_connections` rather than a default of 1024 decides how many clients are served. Logs
/// what it did; a failure (or a platform without the limit) changes nothing and is logged.
pub fn raise_file_limit() {
    let before = open_file_limits().and_then(|(soft, _)| soft);
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(after) => match before {
            Some(before) if after > before => {
                tracing::info!("raised the open-file limit from {before} to {after}");
            }
            _ => tracing::debug!("open-file limit {after}"),
        },
        Err(e) => tracing::warn!("could not raise the open-file limit: {e}"),
    }
}

/// The process's soft and hard open-file limits, read from `/proc/self/limits` (Linux; `None`
/// elsewhere or when unreadable).
fn open_file_limits() -> Option<(Option<u64>, Option<u64>)> {
    let text = std::fs::read_to_string("/proc/self/limits").ok()?;
    parse_open_file_limits(&text)
}

/// The "Max open files" line of a `/proc/<pid>/limits` text: (soft, hard), `None` meaning
/// unlimited.
fn parse_open_file_limits(text: &str) -> Option<(Option<u64>, Option<u64>)> {
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    let mut fields = line["Max open files".len()..].split_whitespace();
    let mut limit = || match fields.next()? {
        "unlimited" => Some(None),
        n => n.parse().ok().map(Some),
    };
    Some((limit()?, limit()?))
}

/// Warns at start-up when `max_connections` leaves no room under the soft open-file limit (each
/// connection is one file; the gateway needs some more of its own: upstream and Redis
/// connections, the key store).
pub fn warn_if_file_limit_is_low(max_connections: usize) {
    let Some((Some(soft), hard)) = open_file_limits() else {
        return;
    };
    let wanted = max_connections as u64 + 256;
    if soft < wanted {
        let hard = hard.map_or("unlimited".to_owned(), |h| h.to_string());
        tracing::warn!(
            "the open-file limit ({soft}, hard limit {hard}) is below general_settings.\
             max_connections ({max_connections}) plus room for upstream connections: raise it \
             (ulimit -n) or lower max_connections; when files run out, accepting pauses"
        );
    }
}

/// EMFILE (the process's file limit) or ENFILE (the system's).
pub(super) fn is_out_of_files(e: &io::Error) -> bool {
    // EMFILE is 24 and ENFILE 23 on Linux and the BSDs.
    matches!(e.raw_os_error(), Some(23 | 24))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_open_file_limits_are_read_from_proc_limits() {
        let text = "Limit                     Soft Limit           Hard Limit           Units     \n\
                    Max processes             63704                63704                processes \n\
                    Max open files            1024                 524288               files     \n";
        assert_eq!(
            parse_open_file_limits(text),
            Some((Some(1024), Some(524_288)))
        );
        let unlimited =
            "Max open files            unlimited            unlimited            files\n";
        assert_eq!(parse_open_file_limits(unlimited), Some((None, None)));
        assert_eq!(parse_open_file_limits("nothing here"), None);
    }
}
