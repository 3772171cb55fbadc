//! The GGUF header of a model file: its key/value pairs (scalars and strings as text) and its
//! tensor directory (names, dimensions, types). No tensor data is read.
// Own reader, no crate: gguf-rs-lib needs Rust 1.87 (this crate: 1.85); gguf, gguf-rs, ggus are pre-1.0 one-project crates.

use std::io::{BufReader, Read};

#[derive(Debug, thiserror::Error)]
/// Why a GGUF header could not be read.
pub enum GgufError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("not a GGUF file (magic {0:?})")]
    Magic([u8; 4]),
    #[error("unknown GGUF value type {0}")]
    Type(u32),
    #[error("implausible GGUF field: {0}")]
    Bad(String),
}

/// Longest string (key, value, tensor name) accepted from a GGUF header.
const MAX_GGUF_STRING: u64 = 1 << 20;
/// Largest tensor dimension accepted (ggml's `ne` is int64; no real weight comes near this).
const MAX_DIM: u64 = 1 << 31;

pub struct Tensor {
    pub name: String,
    /// ggml order: K first.
    pub dims: Vec<u64>,
    pub ggml_type: u32,
}

struct Reader<R: Read>(R);

impl<R: Read> Reader<R> {
    fn bytes<const N: usize>(&mut self) -> Result<[u8; N], GgufError> {
        let mut b = [0u8; N];
        self.0.read_exact(&mut b)?;
        Ok(b)
    }
    fn u32(&mut self) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.bytes()?))
    }
    fn u64(&mut self) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.bytes()?))
    }
    fn string(&mut self) -> Result<String, GgufError> {
        let n = self.u64()?;
        if n > MAX_GGUF_STRING {
            return Err(GgufError::Bad(format!("string of {n} bytes")));
        }
        let mut b = vec![0u8; n as usize];
        self.0.read_exact(&mut b)?;
        Ok(String::from_utf8_lossy(&b).into_owned())
    }
    /// Reads a value of GGUF type `t`; returns it as text for scalars/strings we care about.
    fn value(&mut self, t: u32) -> Result<Option<String>, GgufError> {
        Ok(match t {
            0 | 1 | 7 => Some(self.bytes::<1>()?[0].to_string()),
            2 | 3 => Some(u16::from_le_bytes(self.bytes()?).to_string()),
            4 => Some(self.u32()?.to_string()),
            5 => Some(i32::from_le_bytes(self.bytes()?).to_string()),
            6 => Some(f32::from_le_bytes(self.bytes()?).to_string()),
            8 => Some(self.string()?),
            9 => {
                let (et, n) = (self.u32()?, self.u64()?);
                for _ in 0..n {
                    self.value(et)?;
                }
                None
            }
            10 | 11 => Some(self.u64()?.to_string()),
            12 => Some(f64::from_le_bytes(self.bytes()?).to_string()),
            other => return Err(GgufError::Type(other)),
        })
    }
}

/// GGUF key/value pairs (scalars and strings as text) and the tensor directory.
pub type Gguf = (Vec<(String, String)>, Vec<Tensor>);

pub fn read_gguf(path: &str) -> Result<Gguf, GgufError> {
    let mut r = Reader(BufReader::new(std::fs::File::open(path)?));
    let magic = r.bytes::<4>()?;
    if &magic != b"GGUF" {
        return Err(GgufError::Magic(magic));
    }
    let _version = r.u32()?;
    let (nt, nkv) = (r.u64()?, r.u64()?);
    let mut kv = Vec::new();
    for _ in 0..nkv {
        let k = r.string()?;
        let t = r.u32()?;
        if let Some(v) = r.value(t)? {
            kv.push((k, v));
        }
    }
    let mut tensors = Vec::new();
    for _ in 0..nt {
        let name = r.string()?;
        let nd = r.u32()?;
        if nd > 4 {
            return Err(GgufError::Bad(format!("tensor {name} has {nd} dimensions")));
        }
        let dims = (0..nd).map(|_| r.u64()).collect::<Result<Vec<_>, _>>()?;
        if dims.iter().any(|&d| d > MAX_DIM) {
            return Err(GgufError::Bad(format!("tensor {name} has dimensions {dims:?}")));
        }
        let ggml_type = r.u32()?;
        let _offset = r.u64()?;
        tensors.push(Tensor { name, dims, ggml_type });
    }
    Ok((kv, tensors))
}
