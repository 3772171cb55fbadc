//! The calibration file (`.orkcal`): per weight, the sum and count of the activation rows it
//! received while a calibration text ran with `ORK_CALIBRATE=1`. Their mean is the direction
//! along which `quant::mean::correct_along` corrects every later row of that weight, from that
//! row alone (docs/precision.md).
//!
//! One file, `ORK_CALIBRATION` or `<cache dir>/calibration.orkcal`. Little-endian:
//!
//! | bytes | what |
//! |---|---|
//! | 8 | magic `"ORKCAL01"` |
//! | 8 | entry count E |
//! | E × (20 + 8·K) | key u64, K u32, rows u64, then K f64 sums |
//!
//! A recording process replaces the entries of the weights it saw and keeps the others; it writes
//! a temporary file and renames it over the old one, so a reader sees the old file or the new one.
//! A damaged file is one warning and corrects nothing (every row keeps the NPU's result).

use crate::config::Config;
use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

const MAGIC: &[u8; 8] = b"ORKCAL01";

/// The rows one weight received: their f64 sums per input channel and their count.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    pub rows: u64,
    pub sums: Vec<f64>,
}

impl Entry {
    /// The rows' mean, `[K]`; None without rows or where it is zero or not finite.
    pub fn mean(&self) -> Option<Vec<f32>> {
        if self.rows == 0 {
            return None;
        }
        let d: Vec<f32> = self.sums.iter().map(|&s| (s / self.rows as f64) as f32).collect();
        let dd: f64 = d.iter().map(|&v| v as f64 * v as f64).sum();
        (dd.is_finite() && dd > 0.0).then_some(d)
    }
}

/// A weight's calibration key: xxh3-64 of its name, ggml type, shape and the hash of its source
/// bytes (the `.orkpack` identity's, `cache::format::par_hash`).
pub fn key(name: &str, ggml_type: u32, n: usize, k: usize, src_hash: u128) -> u64 {
    let mut b = Vec::with_capacity(name.len() + 36);
    b.extend_from_slice(name.as_bytes());
    b.push(0);
    b.extend_from_slice(&ggml_type.to_le_bytes());
    b.extend_from_slice(&(n as u64).to_le_bytes());
    b.extend_from_slice(&(k as u64).to_le_bytes());
    b.extend_from_slice(&src_hash.to_le_bytes());
    twox_hash::XxHash3_64::oneshot(&b)
}

/// The file `cfg` names: `ORK_CALIBRATION`, else `calibration.orkcal` in the cache directory.
pub fn path_of(cfg: &Config) -> Option<PathBuf> {
    if let Some(p) = &cfg.calibration {
        return Some(PathBuf::from(p));
    }
    super::resolve_dir(cfg.cache_dir.as_deref(), cfg.xdg_cache_home.as_deref(), cfg.home.as_deref()).map(|d| d.join("calibration.orkcal"))
}

/// Where a calibration file's entries are: each key with the offset of its sums, its K and its
/// rows, for a file of `len` bytes read through `read(at, out)` (fills `out` from byte `at`).
/// Checks the magic, and refuses a truncated file or bytes after the last entry.
fn entries_of(len: u64, read: impl Fn(u64, &mut [u8]) -> Result<(), String>) -> Result<Vec<(u64, u64, usize, u64)>, String> {
    let mut head = [0u8; 16];
    read(0, &mut head)?;
    if &head[..8] != MAGIC {
        return Err("not a calibration file (magic)".into());
    }
    let count = u64::from_le_bytes(head[8..].try_into().expect("8 bytes"));
    let (mut at, mut out) = (16u64, Vec::new());
    for _ in 0..count {
        let mut h = [0u8; 20];
        read(at, &mut h)?;
        let key = u64::from_le_bytes(h[..8].try_into().expect("8 bytes"));
        let k = u32::from_le_bytes(h[8..12].try_into().expect("4 bytes")) as usize;
        let rows = u64::from_le_bytes(h[12..].try_into().expect("8 bytes"));
        out.push((key, at + 20, k, rows));
        at += 20 + 8 * k as u64;
        if at > len {
            return Err(format!("truncated at byte {len}"));
        }
    }
    if at != len {
        return Err(format!("{} bytes after the last entry", len - at));
    }
    Ok(out)
}

/// `k` f64 sums at byte `at` of `b` (in bounds: [`entries_of`] checked them).
fn sums_at(b: &[u8], at: u64, k: usize) -> Vec<f64> {
    b[at as usize..at as usize + 8 * k].chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes"))).collect()
}

/// Decodes a calibration file's bytes.
pub fn decode(b: &[u8]) -> Result<HashMap<u64, Entry>, String> {
    let read = |at: u64, out: &mut [u8]| {
        let s = b.get(at as usize..at as usize + out.len()).ok_or_else(|| format!("truncated at byte {at}"))?;
        out.copy_from_slice(s);
        Ok(())
    };
    Ok(entries_of(b.len() as u64, read)?.into_iter().map(|(key, at, k, rows)| (key, Entry { rows, sums: sums_at(b, at, k) })).collect())
}

/// Encodes entries, in key order (the same entries give the same bytes).
pub fn encode(entries: &HashMap<u64, Entry>) -> Vec<u8> {
    let mut keys: Vec<&u64> = entries.keys().collect();
    keys.sort();
    let mut b = Vec::from(&MAGIC[..]);
    b.extend_from_slice(&(keys.len() as u64).to_le_bytes());
    for key in keys {
        let e = &entries[key];
        b.extend_from_slice(&key.to_le_bytes());
        b.extend_from_slice(&(e.sums.len() as u32).to_le_bytes());
        b.extend_from_slice(&e.rows.to_le_bytes());
        for s in &e.sums {
            b.extend_from_slice(&s.to_le_bytes());
        }
    }
    b
}

/// Where the file's entries are, read at start: each key's sums offset, K and rows. The sums are
/// read from the file when a weight asks for its direction (the file holds every calibrated
/// model's weights; a process needs its own model's).
#[derive(Default)]
struct Index {
    file: Option<std::fs::File>,
    at: HashMap<u64, (u64, usize, u64)>,
}

impl Index {
    /// The index of the file at `path` (empty where there is none).
    fn of(path: &Path) -> Result<Index, String> {
        use std::os::unix::fs::FileExt;
        let file = match std::fs::File::open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Index::default()),
            Err(e) => return Err(e.to_string()),
        };
        let len = file.metadata().map_err(|e| e.to_string())?.len();
        let entries = entries_of(len, |at, out| file.read_exact_at(out, at).map_err(|_| format!("truncated at byte {at}")))?;
        let at = entries.into_iter().map(|(key, at, k, rows)| (key, (at, k, rows))).collect();
        Ok(Index { file: Some(file), at })
    }

    /// Entry `key` if it has width `k`, read from the file.
    fn entry(&self, key: u64, k: usize) -> Option<Entry> {
        use std::os::unix::fs::FileExt;
        let &(at, kk, rows) = self.at.get(&key).filter(|e| e.1 == k)?;
        let mut b = vec![0u8; 8 * kk];
        self.file.as_ref()?.read_exact_at(&mut b, at).ok()?;
        Some(Entry { rows, sums: sums_at(&b, 0, kk) })
    }
}

/// A process's calibration: where the file's entries are, as read at start, and, when recording,
/// the rows this process saw.
pub struct Store {
    path: PathBuf,
    read: Index,
    /// `Some` when recording (`ORK_CALIBRATE=1`).
    recorded: Option<Mutex<HashMap<u64, Entry>>>,
    /// Rows recorded, and rows recorded at the last write (a second flush with nothing new
    /// writes nothing).
    rows: AtomicU64,
    flushed: AtomicU64,
}

impl Store {
    /// The store at `path`; `record`: this process adds its rows to it.
    pub fn open(path: &Path, record: bool) -> Store {
        let read = Index::of(path).unwrap_or_else(|why| {
            log::warn!("calibration file {}: {why}; no row is corrected along a calibrated direction", path.display());
            Index::default()
        });
        Store { path: path.to_owned(), read, recorded: record.then(Default::default), rows: AtomicU64::new(0), flushed: AtomicU64::new(0) }
    }

    /// The store `cfg` asks for: None when the rotation or the correction is off, no path
    /// resolves, or there is neither a file to read nor recording to do.
    pub fn from_config(cfg: &Config) -> Option<Store> {
        if !cfg.corrects_rows() {
            return None;
        }
        let path = path_of(cfg)?;
        (cfg.calibrate || path.exists()).then(|| Store::open(&path, cfg.calibrate))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn recording(&self) -> bool {
        self.recorded.is_some()
    }

    /// The calibrated direction of weight `key` of width `k`: the mean of its recorded rows.
    pub fn direction(&self, key: u64, k: usize) -> Option<Vec<f32>> {
        self.read.entry(key, k).as_ref().and_then(Entry::mean)
    }

    /// Adds rows `x: [M, K]` to weight `key`'s sums (recording only).
    pub fn record(&self, key: u64, x: &[f32], m: usize, k: usize) {
        let Some(rec) = &self.recorded else { return };
        let mut rec = rec.lock().unwrap_or_else(|p| p.into_inner());
        let e = rec.entry(key).or_insert_with(|| Entry { rows: 0, sums: vec![0.0; k] });
        if e.sums.len() != k {
            return;
        }
        for row in x.chunks_exact(k).take(m) {
            for (s, &v) in e.sums.iter_mut().zip(row) {
                *s += v as f64;
            }
        }
        e.rows += m as u64;
        self.rows.fetch_add(m as u64, Relaxed);
    }

    /// Writes the file's entries with this process's recorded ones in place of theirs; returns
    /// how many weights were recorded (0: nothing written).
    pub fn flush(&self) -> io::Result<usize> {
        let Some(rec) = &self.recorded else { return Ok(0) };
        let rec = rec.lock().unwrap_or_else(|p| p.into_inner());
        let rows = self.rows.load(Relaxed);
        if rec.is_empty() || rows == self.flushed.load(Relaxed) {
            return Ok(0);
        }
        // Entries another process wrote since this one started are kept too.
        let mut all = std::fs::read(&self.path).ok().and_then(|b| decode(&b).ok()).unwrap_or_default();
        all.extend(rec.iter().map(|(k, e)| (*k, e.clone())));
        if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        let tmp = self.path.with_extension(format!("tmp{}", std::process::id()));
        std::fs::write(&tmp, encode(&all))?;
        std::fs::rename(&tmp, &self.path)?;
        self.flushed.store(rows, Relaxed);
        Ok(rec.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_and_damage_is_refused() {
        let mut m = HashMap::new();
        m.insert(7u64, Entry { rows: 3, sums: vec![1.5, -2.0, 0.25] });
        m.insert(2u64, Entry { rows: 1, sums: vec![4.0] });
        let b = encode(&m);
        assert_eq!(decode(&b).unwrap(), m);
        assert_eq!(b, encode(&decode(&b).unwrap()), "the same entries give the same bytes");
        assert!(decode(&b[..b.len() - 1]).unwrap_err().contains("truncated"));
        let mut extra = b.clone();
        extra.push(0);
        assert!(decode(&extra).unwrap_err().contains("after the last entry"));
        let mut magic = b;
        magic[0] = b'X';
        assert!(decode(&magic).unwrap_err().contains("magic"));
        assert_eq!(m[&7].mean().unwrap(), vec![0.5, -2.0 / 3.0, 0.25 / 3.0]);
        assert_eq!(Entry { rows: 0, sums: vec![1.0] }.mean(), None);
        assert_eq!(Entry { rows: 2, sums: vec![0.0, 0.0] }.mean(), None, "a zero direction");
    }

    #[test]
    fn a_recording_replaces_its_weights_and_keeps_the_others() {
        let dir = std::env::temp_dir().join(format!("ork-calib-{}", std::process::id()));
        let path = dir.join("c.orkcal");
        let _ = std::fs::remove_dir_all(&dir);
        let a = Store::open(&path, true);
        a.record(1, &[1.0, 2.0, 3.0, 4.0], 2, 2);
        a.record(2, &[5.0], 1, 1);
        assert_eq!(a.flush().unwrap(), 2);
        assert_eq!(a.flush().unwrap(), 0, "nothing new: nothing written");
        let b = Store::open(&path, true);
        assert_eq!(b.direction(1, 2), Some(vec![2.0, 3.0]));
        assert_eq!(b.direction(1, 3), None, "another width");
        b.record(1, &[10.0, 10.0], 1, 2);
        b.flush().unwrap();
        let c = Store::open(&path, false);
        assert_eq!((c.direction(1, 2), c.direction(2, 1)), (Some(vec![10.0, 10.0]), Some(vec![5.0])));
        c.record(3, &[1.0], 1, 1);
        assert_eq!(c.flush().unwrap(), 0, "a reading store writes nothing");
        std::fs::write(&path, b"ORKCAL01\x05").unwrap();
        assert!(Store::open(&path, false).read.at.is_empty(), "a damaged file corrects nothing");
        // The store reads entries from the file as weights ask: the index refuses what decode does.
        let mut m = HashMap::new();
        m.insert(7u64, Entry { rows: 2, sums: vec![1.0, 4.0] });
        let good = encode(&m);
        std::fs::write(&path, &good).unwrap();
        assert_eq!(Store::open(&path, false).direction(7, 2), Some(vec![0.5, 2.0]));
        for bad in [&good[..good.len() - 1], &[good.as_slice(), &[0]].concat()[..]] {
            std::fs::write(&path, bad).unwrap();
            assert!(Store::open(&path, false).read.at.is_empty(), "truncated or trailing bytes: nothing read");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
