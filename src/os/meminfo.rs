//! `/proc/meminfo`: the system RAM the NPU shares (resident weights come out of it). The one
//! parser of that file in the crate; the ggml device's free/total memory and the default
//! weight-residency budget both read it here.

/// Sizes from `/proc/meminfo`, in bytes; `None` for a field the file lacks, or for every field
/// when the file cannot be read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemInfo {
    /// `MemTotal`: usable RAM.
    pub total_bytes: Option<u64>,
    /// `MemAvailable`: RAM that can be allocated without swapping.
    pub available_bytes: Option<u64>,
}

impl MemInfo {
    /// Parses the text of `/proc/meminfo` (`Name:   <value> kB` lines; values in KiB).
    pub fn parse(text: &str) -> MemInfo {
        let field = |name: &str| -> Option<u64> {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|kib| kib.parse::<u64>().ok())
                .map(|kib| kib.saturating_mul(1024))
        };
        MemInfo { total_bytes: field("MemTotal"), available_bytes: field("MemAvailable") }
    }
}

/// Reads `/proc/meminfo` now (all fields `None` when it cannot be read).
pub fn read() -> MemInfo {
    std::fs::read_to_string("/proc/meminfo").map(|t| MemInfo::parse(&t)).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_total_and_available() {
        let text = "MemTotal:       16106844 kB\nMemFree:         1234567 kB\nMemAvailable:    8053422 kB\n";
        let m = MemInfo::parse(text);
        assert_eq!(m.total_bytes, Some(16106844 * 1024));
        assert_eq!(m.available_bytes, Some(8053422 * 1024));
    }

    #[test]
    fn missing_or_bad_fields_are_none() {
        assert_eq!(MemInfo::parse(""), MemInfo::default());
        let m = MemInfo::parse("MemTotalX: 5 kB\nMemTotal: lots kB\nMemAvailable: 7 kB\n");
        assert_eq!(m, MemInfo { total_bytes: None, available_bytes: Some(7 * 1024) });
    }

    #[test]
    fn this_machine_reports_some_ram() {
        if std::path::Path::new("/proc/meminfo").exists() {
            assert!(read().total_bytes.is_some_and(|b| b > 0));
        }
    }
}
