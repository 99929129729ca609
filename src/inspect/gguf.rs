//! The header of a GGUF file (llama.cpp's format): metadata key/values and tensor infos, read
//! without touching the tensor data.
//!
//! Why not `candle_core::quantized::gguf_file::Content::read`: it rejects any tensor type candle
//! cannot compute with (MXFP4, the IQ quants, TQ …), so the GGUF builds of gpt-oss, or any
//! `IQ4_XS` file, would show up as broken in `inferno list`. Listing must describe every file,
//! whether or not we can run it, so this reader keeps tensor types as raw numbers and names them
//! from ggml's table. It also skips array values (the tokenizer's 100k+ strings) instead of
//! keeping them, unless asked for the whole metadata ([`read_full`], which loaders use: candle's
//! reader cannot open an MXFP4 file at all, see `crate::models::gguf`).
//!
//! Format: <https://github.com/ggml-org/ggml/blob/master/docs/gguf.md>.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufReader, Read, Seek};
use std::path::Path;

use anyhow::{Context, bail};
use candle_core::quantized::gguf_file::Value;

const MAGIC: u32 = 0x4655_4747; // "GGUF" read as little-endian u32
const F32: u32 = 0;
const MXFP4: u32 = 39;
const MAX_DIMS: u32 = 4;
const MAX_ARRAY_DEPTH: u32 = 8;
const DEFAULT_ALIGNMENT: u64 = 32;
/// Longest metadata string we accept (chat templates are tens of kB): a corrupt length must
/// not make us allocate gigabytes.
const MAX_STRING_LEN: u64 = 64 << 20;

/// A metadata value. Arrays keep only their length: nothing we report needs their contents.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    UInt(u64),
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(String),
    Array { len: u64 },
}

/// One tensor's info; `ggml_type` is ggml's number (see [`type_name`]).
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// ggml order: innermost dimension first.
    pub dims: Vec<u64>,
    pub ggml_type: u32,
    /// Offset from the start of the data section.
    pub offset: u64,
    /// Bytes of data: exact for types in [`type_layout`], else up to the next tensor's offset.
    pub bytes: u64,
}

/// The parsed header of one GGUF file.
#[derive(Debug, Clone)]
pub struct Header {
    pub version: u32,
    pub metadata: BTreeMap<String, MetaValue>,
    pub tensors: Vec<TensorInfo>,
    /// Where the tensor data starts in the file (tensor offsets count from here).
    pub data_offset: u64,
}

impl Header {
    pub fn get_str(&self, key: &str) -> Option<&str> {
        match self.metadata.get(key)? {
            MetaValue::Str(s) => Some(s),
            _ => None,
        }
    }

    /// An unsigned value; accepts any non-negative integer type, as writers differ.
    pub fn get_u64(&self, key: &str) -> Option<u64> {
        match self.metadata.get(key)? {
            MetaValue::UInt(v) => Some(*v),
            MetaValue::Int(v) => u64::try_from(*v).ok(),
            _ => None,
        }
    }

    /// `general.architecture`, e.g. `llama`, `gpt-oss`, `qwen3`.
    pub fn architecture(&self) -> Option<&str> {
        self.get_str("general.architecture")
    }

    /// `<arch>.context_length`: the context the model was trained for.
    pub fn context_length(&self) -> Option<u64> {
        self.get_u64(&format!("{}.context_length", self.architecture()?))
    }

    /// The quantization label shown to users, e.g. `Q4_K_M`.
    ///
    /// Taken from `general.file_type` when the file declares a known one: it names the recipe
    /// (`Q4_K_M` vs `Q4_K_S`), which is what users know from file names. Otherwise the tensor
    /// type holding the most bytes among 2-D and larger tensors (1-D norms and biases stay f32
    /// in every recipe, so they would only blur the answer).
    ///
    /// Files with MXFP4 tensors (gpt-oss) are labelled by their tensor types instead, MXFP4
    /// first, e.g. `MXFP4 + Q8_0`: their `general.file_type` says little (llama.cpp's converter
    /// writes `MXFP4_MOE` or, with `--outtype q8_0`, `Q8_0` for the same experts).
    pub fn quant_label(&self) -> Option<String> {
        if self.tensors.iter().any(|t| t.ggml_type == MXFP4) {
            return Some(self.mixed_label());
        }
        let declared = self.get_u64("general.file_type").and_then(|t| u32::try_from(t).ok());
        if let Some(name) = declared.and_then(file_type_name) {
            return Some(name.to_string());
        }
        self.dominant_tensor_type().map(type_name)
    }

    /// The ggml type with the most bytes among tensors of two or more dimensions.
    pub fn dominant_tensor_type(&self) -> Option<u32> {
        let mut best: Option<(u32, u64)> = None;
        for (ty, b) in self.bytes_by_type() {
            if best.is_none_or(|(_, most)| b > most) {
                best = Some((ty, b));
            }
        }
        best.map(|(ty, _)| ty)
    }

    /// Bytes per ggml type among tensors of two or more dimensions.
    fn bytes_by_type(&self) -> BTreeMap<u32, u64> {
        let mut bytes: BTreeMap<u32, u64> = BTreeMap::new();
        for t in self.tensors.iter().filter(|t| t.dims.iter().filter(|&&d| d > 1).count() >= 2) {
            *bytes.entry(t.ggml_type).or_insert(0) += t.bytes;
        }
        bytes
    }

    /// `MXFP4 + …`: the other types of 2-D and larger tensors by bytes, F32 left out (routers and
    /// stacked biases are F32 in every recipe).
    fn mixed_label(&self) -> String {
        let mut others: Vec<(u32, u64)> =
            self.bytes_by_type().into_iter().filter(|&(ty, _)| ty != MXFP4 && ty != F32).collect();
        others.sort_by_key(|&(ty, b)| (std::cmp::Reverse(b), ty));
        let names = std::iter::once(MXFP4).chain(others.into_iter().map(|(ty, _)| ty));
        names.map(type_name).collect::<Vec<_>>().join(" + ")
    }
}

/// Reads and validates the header of the GGUF file at `path`.
pub fn read_header(path: &Path) -> anyhow::Result<Header> {
    read_path(path, None)
}

/// Every metadata value in full, arrays included, as candle's [`Value`]s (what the tokenizer
/// builder takes).
pub type FullMetadata = HashMap<String, Value>;

/// Reads and validates the header of the GGUF file at `path`, keeping every metadata value.
pub fn read_full(path: &Path) -> anyhow::Result<(Header, FullMetadata)> {
    let mut full = FullMetadata::new();
    let header = read_path(path, Some(&mut full))?;
    Ok((header, full))
}

fn read_path(path: &Path, full: Option<&mut FullMetadata>) -> anyhow::Result<Header> {
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let len = file.metadata().with_context(|| format!("reading {}", path.display()))?.len();
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let mut r = Reader { inner: BufReader::with_capacity(1 << 16, file), pos: 0, len };
    read_header_from(&mut r, full).with_context(|| format!("{name}: not a valid GGUF file"))
}

/// A buffered reader that knows its position and the file length, so every length read from
/// the file can be checked against what is left before anything is allocated.
struct Reader<R> {
    inner: BufReader<R>,
    pos: u64,
    len: u64,
}

impl<R: Read + Seek> Reader<R> {
    fn remaining(&self) -> u64 {
        self.len.saturating_sub(self.pos)
    }

    fn bytes<const N: usize>(&mut self) -> anyhow::Result<[u8; N]> {
        if (N as u64) > self.remaining() {
            bail!("truncated at byte {}", self.pos);
        }
        let mut buf = [0u8; N];
        self.inner.read_exact(&mut buf).with_context(|| format!("reading at byte {}", self.pos))?;
        self.pos += N as u64;
        Ok(buf)
    }

    fn u32(&mut self) -> anyhow::Result<u32> {
        Ok(u32::from_le_bytes(self.bytes()?))
    }

    fn u64(&mut self) -> anyhow::Result<u64> {
        Ok(u64::from_le_bytes(self.bytes()?))
    }

    fn skip(&mut self, n: u64) -> anyhow::Result<()> {
        if n > self.remaining() {
            bail!("truncated: {n} bytes needed at byte {}, {} left", self.pos, self.remaining());
        }
        let step = i64::try_from(n).context("skip too large")?;
        self.inner.seek_relative(step)?;
        self.pos += n;
        Ok(())
    }

    /// A length prefix: u32 in GGUF v1, u64 later.
    fn len_prefix(&mut self, version: u32) -> anyhow::Result<u64> {
        if version == 1 { self.u32().map(u64::from) } else { self.u64() }
    }

    fn string(&mut self, version: u32) -> anyhow::Result<String> {
        let n = self.len_prefix(version)?;
        if n > MAX_STRING_LEN {
            bail!("string of {n} bytes at byte {} (corrupt length?)", self.pos);
        }
        if n > self.remaining() {
            bail!("truncated: string of {n} bytes at byte {}, {} left", self.pos, self.remaining());
        }
        let mut buf = vec![0u8; n as usize];
        self.inner.read_exact(&mut buf)?;
        self.pos += n;
        // Some writers NUL-terminate; some strings are not valid UTF-8. Neither is fatal here.
        while buf.last() == Some(&0) {
            buf.pop();
        }
        Ok(String::from_utf8_lossy(&buf).into_owned())
    }
}

fn read_header_from<R: Read + Seek>(
    r: &mut Reader<R>,
    mut full: Option<&mut FullMetadata>,
) -> anyhow::Result<Header> {
    if r.u32().context("reading the magic")? != MAGIC {
        bail!("no GGUF magic at the start");
    }
    let version = r.u32()?;
    if !(1..=3).contains(&version) {
        bail!("unsupported GGUF version {version}");
    }
    let tensor_count = r.len_prefix(version)?;
    let kv_count = r.len_prefix(version)?;
    // Each key/value and tensor info takes at least 8 bytes: reject absurd counts up front.
    if tensor_count.saturating_add(kv_count).saturating_mul(8) > r.remaining() {
        bail!("truncated: header declares {tensor_count} tensors and {kv_count} metadata entries");
    }
    let mut metadata = BTreeMap::new();
    for _ in 0..kv_count {
        let key = r.string(version)?;
        let ty = r.u32()?;
        let value = match full.as_deref_mut() {
            Some(full) => {
                let v = read_full_value(r, version, ty, 0)
                    .with_context(|| format!("metadata {key:?}"))?;
                let summary = summarize(&v);
                full.insert(key.clone(), v);
                summary
            }
            None => read_value(r, version, ty, 0).with_context(|| format!("metadata {key:?}"))?,
        };
        metadata.insert(key, value);
    }
    let mut tensors = Vec::with_capacity(tensor_count.min(1 << 16) as usize);
    for _ in 0..tensor_count {
        tensors.push(read_tensor_info(r, version)?);
    }
    let alignment = match metadata.get("general.alignment") {
        Some(MetaValue::UInt(a)) if a.is_power_of_two() => *a,
        Some(other) => bail!("bad general.alignment {other:?}"),
        None => DEFAULT_ALIGNMENT,
    };
    let data_offset = r.pos.div_ceil(alignment) * alignment;
    // A vocabulary-only file (llama.cpp's `--vocab-only`) ends at its header, unpadded.
    let data_len = match r.len.checked_sub(data_offset) {
        Some(n) => n,
        None if tensors.is_empty() => 0,
        None => bail!("truncated: no tensor data section"),
    };
    size_tensors(&mut tensors, data_len)?;
    Ok(Header { version, metadata, tensors, data_offset })
}

fn read_tensor_info<R: Read + Seek>(r: &mut Reader<R>, version: u32) -> anyhow::Result<TensorInfo> {
    let name = r.string(version)?;
    let n_dims = r.u32()?;
    if n_dims > MAX_DIMS {
        bail!("tensor {name:?} has {n_dims} dimensions (max {MAX_DIMS})");
    }
    let dims = (0..n_dims).map(|_| r.len_prefix(version)).collect::<anyhow::Result<Vec<u64>>>()?;
    let ggml_type = r.u32()?;
    let offset = r.u64()?;
    Ok(TensorInfo { name, dims, ggml_type, offset, bytes: 0 })
}

/// Fills in `bytes` and checks every tensor lies inside the `data_len` bytes of data.
fn size_tensors(tensors: &mut [TensorInfo], data_len: u64) -> anyhow::Result<()> {
    let mut by_offset: Vec<usize> = (0..tensors.len()).collect();
    by_offset.sort_by_key(|&i| tensors[i].offset);
    for (k, &i) in by_offset.iter().enumerate() {
        let next = by_offset.get(k + 1).map_or(data_len, |&j| tensors[j].offset);
        let t = &tensors[i];
        let exact = exact_bytes(t.ggml_type, &t.dims);
        let end = t.offset.saturating_add(exact.unwrap_or(0));
        if t.offset > data_len || end > data_len {
            bail!("truncated: tensor {:?} ends past the end of the file", t.name);
        }
        tensors[i].bytes = exact.unwrap_or(next.saturating_sub(t.offset));
    }
    Ok(())
}

fn exact_bytes(ggml_type: u32, dims: &[u64]) -> Option<u64> {
    let (block, size) = type_layout(ggml_type)?;
    let elems = dims.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d))?;
    elems.div_ceil(block).checked_mul(size)
}

/// Reads one value of type `ty`; arrays are skipped, keeping their length.
fn read_value<R: Read + Seek>(
    r: &mut Reader<R>,
    version: u32,
    ty: u32,
    depth: u32,
) -> anyhow::Result<MetaValue> {
    Ok(match ty {
        0 => MetaValue::UInt(r.bytes::<1>()?[0].into()),
        1 => MetaValue::Int(i8::from_le_bytes(r.bytes()?).into()),
        2 => MetaValue::UInt(u16::from_le_bytes(r.bytes()?).into()),
        3 => MetaValue::Int(i16::from_le_bytes(r.bytes()?).into()),
        4 => MetaValue::UInt(r.u32()?.into()),
        5 => MetaValue::Int(i32::from_le_bytes(r.bytes()?).into()),
        6 => MetaValue::Float(f32::from_le_bytes(r.bytes()?).into()),
        7 => MetaValue::Bool(r.bytes::<1>()?[0] != 0),
        8 => MetaValue::Str(r.string(version)?),
        9 => skip_array(r, version, depth)?,
        10 => MetaValue::UInt(r.u64()?),
        11 => MetaValue::Int(i64::from_le_bytes(r.bytes()?)),
        12 => MetaValue::Float(f64::from_le_bytes(r.bytes()?)),
        other => bail!("unknown metadata value type {other}"),
    })
}

/// Reads one value of type `ty` in full, arrays included.
fn read_full_value<R: Read + Seek>(
    r: &mut Reader<R>,
    version: u32,
    ty: u32,
    depth: u32,
) -> anyhow::Result<Value> {
    Ok(match ty {
        0 => Value::U8(r.bytes::<1>()?[0]),
        1 => Value::I8(i8::from_le_bytes(r.bytes()?)),
        2 => Value::U16(u16::from_le_bytes(r.bytes()?)),
        3 => Value::I16(i16::from_le_bytes(r.bytes()?)),
        4 => Value::U32(r.u32()?),
        5 => Value::I32(i32::from_le_bytes(r.bytes()?)),
        6 => Value::F32(f32::from_le_bytes(r.bytes()?)),
        7 => Value::Bool(r.bytes::<1>()?[0] != 0),
        8 => Value::String(r.string(version)?),
        9 => {
            if depth >= MAX_ARRAY_DEPTH {
                bail!("arrays nested deeper than {MAX_ARRAY_DEPTH}");
            }
            let elem_ty = r.u32()?;
            let len = r.len_prefix(version)?;
            // Every element takes at least one byte: a corrupt length fails here, before
            // anything is allocated for it.
            if len > r.remaining() {
                bail!("truncated: array of {len} elements, {} bytes left", r.remaining());
            }
            let mut items = Vec::with_capacity(len.min(1 << 20) as usize);
            for _ in 0..len {
                items.push(read_full_value(r, version, elem_ty, depth + 1)?);
            }
            Value::Array(items)
        }
        10 => Value::U64(r.u64()?),
        11 => Value::I64(i64::from_le_bytes(r.bytes()?)),
        12 => Value::F64(f64::from_le_bytes(r.bytes()?)),
        other => bail!("unknown metadata value type {other}"),
    })
}

/// The [`MetaValue`] a full value is listed as.
fn summarize(v: &Value) -> MetaValue {
    match v {
        Value::U8(x) => MetaValue::UInt((*x).into()),
        Value::U16(x) => MetaValue::UInt((*x).into()),
        Value::U32(x) => MetaValue::UInt((*x).into()),
        Value::U64(x) => MetaValue::UInt(*x),
        Value::I8(x) => MetaValue::Int((*x).into()),
        Value::I16(x) => MetaValue::Int((*x).into()),
        Value::I32(x) => MetaValue::Int((*x).into()),
        Value::I64(x) => MetaValue::Int(*x),
        Value::F32(x) => MetaValue::Float((*x).into()),
        Value::F64(x) => MetaValue::Float(*x),
        Value::Bool(x) => MetaValue::Bool(*x),
        Value::String(x) => MetaValue::Str(x.clone()),
        Value::Array(items) => MetaValue::Array { len: items.len() as u64 },
    }
}

fn skip_array<R: Read + Seek>(
    r: &mut Reader<R>,
    version: u32,
    depth: u32,
) -> anyhow::Result<MetaValue> {
    if depth >= MAX_ARRAY_DEPTH {
        bail!("arrays nested deeper than {MAX_ARRAY_DEPTH}");
    }
    let elem_ty = r.u32()?;
    let len = r.len_prefix(version)?;
    let fixed = match elem_ty {
        0 | 1 | 7 => Some(1),
        2 | 3 => Some(2),
        4..=6 => Some(4),
        10..=12 => Some(8),
        _ => None,
    };
    match fixed {
        Some(size) => r.skip(len.checked_mul(size).context("array too large")?)?,
        None => {
            if len > r.remaining() {
                bail!("truncated: array of {len} elements, {} bytes left", r.remaining());
            }
            for _ in 0..len {
                read_value(r, version, elem_ty, depth + 1)?;
            }
        }
    }
    Ok(MetaValue::Array { len })
}

/// ggml's name for a tensor type number (`ggml_type` in ggml.h), e.g. 12 -> `Q4_K`.
pub fn type_name(ty: u32) -> String {
    #[rustfmt::skip]
    const NAMES: [(u32, &str); 33] = [
        (0, "F32"), (1, "F16"), (2, "Q4_0"), (3, "Q4_1"), (6, "Q5_0"), (7, "Q5_1"), (8, "Q8_0"),
        (9, "Q8_1"), (10, "Q2_K"), (11, "Q3_K"), (12, "Q4_K"), (13, "Q5_K"), (14, "Q6_K"),
        (15, "Q8_K"), (16, "IQ2_XXS"), (17, "IQ2_XS"), (18, "IQ3_XXS"), (19, "IQ1_S"),
        (20, "IQ4_NL"), (21, "IQ3_S"), (22, "IQ2_S"), (23, "IQ4_XS"), (24, "I8"), (25, "I16"),
        (26, "I32"), (27, "I64"), (28, "F64"), (29, "IQ1_M"), (30, "BF16"), (34, "TQ1_0"),
        (35, "TQ2_0"), (39, "MXFP4"), (40, "NVFP4"),
    ];
    NAMES.iter().find(|(n, _)| *n == ty).map_or_else(|| format!("type{ty}"), |(_, s)| s.to_string())
}

/// (elements per block, bytes per block) for the types whose layout we are sure of; the rest
/// are sized from tensor offsets instead.
pub fn type_layout(ty: u32) -> Option<(u64, u64)> {
    Some(match ty {
        0 => (1, 4),      // F32
        1 | 30 => (1, 2), // F16, BF16
        2 => (32, 18),    // Q4_0: f16 scale + 16 bytes of nibbles
        3 => (32, 20),    // Q4_1
        6 => (32, 22),    // Q5_0
        7 => (32, 24),    // Q5_1
        8 => (32, 34),    // Q8_0
        9 => (32, 36),    // Q8_1
        10 => (256, 84),  // Q2_K
        11 => (256, 110), // Q3_K
        12 => (256, 144), // Q4_K
        13 => (256, 176), // Q5_K
        14 => (256, 210), // Q6_K
        15 => (256, 292), // Q8_K
        20 => (32, 18),   // IQ4_NL
        23 => (256, 136), // IQ4_XS
        39 => (32, 17),   // MXFP4: e8m0 scale + 16 bytes of fp4 pairs
        _ => return None,
    })
}

/// llama.cpp's name for a `general.file_type` (`llama_ftype` in llama.h), e.g. 15 -> `Q4_K_M`.
pub fn file_type_name(ft: u32) -> Option<&'static str> {
    Some(match ft {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        7 => "Q8_0",
        8 => "Q5_0",
        9 => "Q5_1",
        10 => "Q2_K",
        11 => "Q3_K_S",
        12 => "Q3_K_M",
        13 => "Q3_K_L",
        14 => "Q4_K_S",
        15 => "Q4_K_M",
        16 => "Q5_K_S",
        17 => "Q5_K_M",
        18 => "Q6_K",
        19 => "IQ2_XXS",
        20 => "IQ2_XS",
        21 => "Q2_K_S",
        22 => "IQ3_XS",
        23 => "IQ3_XXS",
        24 => "IQ1_S",
        25 => "IQ4_NL",
        26 => "IQ3_S",
        27 => "IQ3_M",
        28 => "IQ2_S",
        29 => "IQ2_M",
        30 => "IQ4_XS",
        31 => "IQ1_M",
        32 => "BF16",
        36 => "TQ1_0",
        37 => "TQ2_0",
        38 => "MXFP4_MOE",
        _ => return None,
    })
}

#[cfg(test)]
mod tests;
