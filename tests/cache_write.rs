//! The `.orkpack` write path: an entry written by `PackCache::store` (with `O_DIRECT` where the
//! filesystem takes it, hashing the payload in the same pass) is byte for byte the file
//! `encode_file` below describes, and opens as a hit.

use ggml_ork::cache::{self, format, PackCache};
use ggml_ork::npu::soc::{SocDesc, SocId};

#[test]
fn a_stored_entry_is_the_encoded_file_byte_for_byte() {
    // O_DIRECT (the default) and buffered (ORK_CACHE_DIRECT=0).
    for direct in [true, false] {
        store_and_compare(direct);
    }
}

fn store_and_compare(direct: bool) {
    let tmp = tempfile::tempdir_in(std::env::temp_dir()).unwrap();
    // No free-space reserve: the check is of the bytes written, on whatever disk the tests run.
    let c = PackCache::new(tmp.path(), u64::MAX).with_direct(direct).with_disk_reserve(0);
    // N × K with one weight term: tiles of 33 MiB + 4 KiB + 96 bytes (more than two bounce
    // buffers, a tail that is no multiple of a page), scales [N] ++ [K].
    let (n, k) = (96usize, 98_347usize);
    let src: Vec<u8> = (0..n * k * 4).map(|i| (i * 7 + 3) as u8).collect();
    let id = cache::identity(&SocDesc::get(SocId::Rk3588), 0, &src, 4 * k, "blk.0.ffn_down.weight", n, k, 1, None);
    let tiles: Vec<u8> = (0..(33 << 20) + 4096 + 96).map(|i: usize| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let scales: Vec<f32> = (0..n + k).map(|i| 1.0 + i as f32 / 7.0).collect();
    let path = c.store(&id, &tiles, &scales).unwrap();
    let written = std::fs::read(&path).unwrap();
    let want = encode_file(&id.normalized(), cache::quant_params(), &tiles, &scales);
    assert_eq!(written.len(), want.len());
    let first_diff = written.iter().zip(&want).position(|(a, b)| a != b);
    assert_eq!(first_diff, None, "written file (direct: {direct}) differs from the encoded one");
    let hit = c.open(&id).expect("the entry opens");
    assert_eq!(hit.header().tiles_bytes as usize, tiles.len());
    // No temporary file left beside it.
    let dir = path.parent().unwrap();
    let names: Vec<_> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names.len(), 1, "{names:?}");
}

/// The whole `.orkpack` file image in memory, as `format::write_file` streams it.
fn encode_file(id: &cache::Identity, quant: format::QuantParams, tiles: &[u8], scales: &[f32]) -> Vec<u8> {
    let mut f = Vec::new();
    format::write_file(&mut f, id, quant, tiles, scales).expect("writing to a Vec cannot fail");
    f
}
