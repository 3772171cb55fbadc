//! The copy rate `ork-route`'s `board::STREAM_COPY_BPS_HERE` stands for: packed tiles copied
//! from a mapped `.orkpack`-sized file (in the page cache) into an NPU-buffer-sized anonymous ring
//! slot, one thread, as the streaming path does per weight.
//!
//!   cargo run --release --example stream_copy_rate [MIB] [PASSES]     (default 256 MiB, 5 passes)
//!
//! Writes a temporary file of MIB MiB, maps it, touches it once (page cache warm), then copies it
//! PASSES times through a 32 MiB ring slot (two slots alternating, pre-faulted) and prints the
//! median rate and the load average.

use std::io::Write;
use std::time::Instant;

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let mib = args.first().copied().unwrap_or(256).max(32);
    let passes = args.get(1).copied().unwrap_or(5).max(1);
    let dir = std::env::temp_dir().join(format!("ork-stream-copy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("tiles.bin");
    {
        let mut f = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
        let block: Vec<u8> = (0..1 << 20).map(|i| (i * 131 + 7) as u8).collect();
        for _ in 0..mib {
            f.write_all(&block).unwrap();
        }
        f.flush().unwrap();
    }
    let file = std::fs::File::open(&path).unwrap();
    // SAFETY: a private temporary file this process made and nobody else writes.
    let map = unsafe { memmap2::Mmap::map(&file) }.unwrap();
    let mut sum = 0u64;
    for p in map.chunks(4096) {
        sum = sum.wrapping_add(p[0] as u64);
    }
    const SLOT: usize = 32 << 20;
    let mut slots = [vec![1u8; SLOT], vec![1u8; SLOT]];
    let mut rates = Vec::new();
    for _ in 0..passes {
        let t = Instant::now();
        for (i, piece) in map.chunks(SLOT).enumerate() {
            let dst = &mut slots[i % 2][..piece.len()];
            dst.copy_from_slice(piece);
            sum = sum.wrapping_add(dst[piece.len() - 1] as u64);
        }
        rates.push(map.len() as f64 / t.elapsed().as_secs_f64());
    }
    rates.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "stream copy, mapped file -> ring slot, {mib} MiB x {passes} passes: median {:.2} GB/s (min {:.2}, max {:.2}); load average {} (checksum {sum})",
        rates[rates.len() / 2] / 1e9,
        rates[0] / 1e9,
        rates[rates.len() - 1] / 1e9,
        load.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
    );
    drop(map);
    let _ = std::fs::remove_dir_all(&dir);
}
