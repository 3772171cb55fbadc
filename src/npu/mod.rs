//! NPU core (mechanism). TEMPORARY integration shim with the agreed public API; replaced by the
//! real core (regcmd, simulator, planner) when that branch lands. Not a deliverable.
pub mod kif;
pub mod soc;
pub mod detect;
pub mod hostcpu;

use std::sync::Arc;

pub enum NpuKind { Auto, Sim, Rknpu, Rocket }
pub struct NpuConfig { pub kind: NpuKind, pub soc: Option<soc::SocId>, pub max_cores: Option<u32>, pub pin_cpus: Vec<usize>, pub wcache_budget_bytes: Option<u64> }
#[derive(Debug, thiserror::Error)]
pub enum NpuError {
    #[error("no NPU device: {0}")]
    NoDevice(String),
    #[error("unsupported: {0}")]
    Unsupported(String),
}
pub struct Npu { soc: soc::SocDesc }
pub struct ResidentWeight { n: usize, k: usize, w: Vec<i8> }
impl ResidentWeight { pub fn n(&self) -> usize { self.n } pub fn k(&self) -> usize { self.k } pub fn resident_bytes(&self) -> u64 { self.w.len() as u64 } }
pub struct TiledWeight { pub n: usize, pub k: usize, pub bytes: Vec<u8> }
#[derive(Clone, Copy, Debug)] pub struct Budget { pub max_cores: u32 }
#[derive(Clone, Copy, Debug, Default)] pub struct RunStats { pub submits: u32, pub programs: u32, pub cores: u32, pub device_ns: u64, pub host_ns: u64 }
impl Npu {
    pub fn open(cfg: &NpuConfig) -> Result<Arc<Npu>, NpuError> {
        match cfg.kind { NpuKind::Sim => Ok(Arc::new(Npu { soc: soc::SocDesc::get(cfg.soc.unwrap_or(soc::SocId::Rk3588)) })), _ => Err(NpuError::NoDevice("no /dev/dri rknpu node and no /dev/accel rocket node".into())) }
    }
    pub fn soc(&self) -> &soc::SocDesc { &self.soc }
    pub fn describe(&self) -> String { "ORK NPU rk3588 (shim)".into() }
    pub fn check_shape(&self, n: usize, k: usize) -> Result<(), NpuError> { if n % 32 == 0 && k % 32 == 0 && n > 0 && k > 0 { Ok(()) } else { Err(NpuError::Unsupported(format!("N={n} K={k}"))) } }
    pub fn tile_weight(_soc: &soc::SocDesc, w: &[i8], n: usize, k: usize) -> Result<TiledWeight, NpuError> { Ok(TiledWeight { n, k, bytes: bytemuck::cast_slice(w).to_vec() }) }
    pub fn upload(&self, tw: &TiledWeight) -> Result<Arc<ResidentWeight>, NpuError> { Ok(Arc::new(ResidentWeight { n: tw.n, k: tw.k, w: bytemuck::cast_slice(&tw.bytes).to_vec() })) }
    pub fn upload_bytes(&self, n: usize, k: usize, bytes: &[u8]) -> Result<Arc<ResidentWeight>, NpuError> { if bytes.len() != n * k { return Err(NpuError::Unsupported("size".into())); } Ok(Arc::new(ResidentWeight { n, k, w: bytemuck::cast_slice(bytes).to_vec() })) }
    pub fn mm_run(&self, w: &ResidentWeight, a: &[i8], m: usize, c: &mut [i32], _b: Budget) -> Result<RunStats, NpuError> { c.copy_from_slice(&reference_mm(a, &w.w, m, w.k, w.n)); Ok(RunStats::default()) }
}
pub fn reference_mm(a: &[i8], w: &[i8], m: usize, k: usize, n: usize) -> Vec<i32> {
    use rayon::prelude::*;
    let mut c = vec![0i32; m * n];
    c.par_chunks_mut(n.max(1)).enumerate().for_each(|(i, row)| { for j in 0..n { row[j] = a[i*k..(i+1)*k].iter().zip(&w[j*k..(j+1)*k]).map(|(&x, &y)| x as i16 as i32 * y as i16 as i32).sum(); } });
    c
}
