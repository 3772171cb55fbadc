//! A small `log` backend: each record on stderr, every line of it prefixed `ork:`, level from
//! `ORK_LOG`.
//! (llama.cpp tools print their own logs on stderr too, so ours interleave in order.)

use std::io::Write;

struct StderrLog;

impl log::Log for StderrLog {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.level() <= log::max_level()
    }
    fn log(&self, r: &log::Record<'_>) {
        if self.enabled(r.metadata()) {
            let lvl = match r.level() {
                log::Level::Error => "error: ",
                log::Level::Warn => "warning: ",
                _ => "",
            };
            // One write per record, so lines from several threads and from the host do not
            // interleave; each line of a record of several is prefixed too.
            let _ = std::io::stderr().lock().write_all(prefixed(lvl, &r.args().to_string()).as_bytes());
        }
    }
    fn flush(&self) {}
}

/// `msg` as the logger writes it: every line prefixed `ork: `, the first with the level's word.
fn prefixed(lvl: &str, msg: &str) -> String {
    let mut out = String::with_capacity(msg.len() + 16);
    for (i, line) in msg.split('\n').enumerate() {
        out += "ork: ";
        if i == 0 {
            out += lvl;
        }
        out += line;
        out.push('\n');
    }
    out
}

static LOGGER: StderrLog = StderrLog;

/// Installs the logger (first caller wins; a host that installed its own keeps it).
pub fn init(level: log::LevelFilter) {
    if log::set_logger(&LOGGER).is_ok() {
        log::set_max_level(level);
    }
}

/// For a condition that repeats per weight: a warning the `first` time (with `more` appended,
/// e.g. where the repeats go), a debug line of `msg` after.
pub fn warn_first(first: bool, msg: &str, more: &str) {
    if first {
        log::warn!("{msg}{more}");
    } else {
        log::debug!("{msg}");
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_line_of_a_record_is_prefixed() {
        assert_eq!(super::prefixed("", "one"), "ork: one\n");
        assert_eq!(super::prefixed("warning: ", "one\n  two"), "ork: warning: one\nork:   two\n");
    }
}
