//! A small `log` backend: one line per record on stderr, prefixed `ork:`, level from `ORK_LOG`.
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
            // One write per line, so lines from several threads and from the host do not interleave.
            let line = format!("ork: {lvl}{}\n", r.args());
            let _ = std::io::stderr().lock().write_all(line.as_bytes());
        }
    }
    fn flush(&self) {}
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
