//! Tensor data of a GGUF file, for loaders of architectures whose GGUF files candle cannot open.
//!
//! Why not `candle_core::quantized::gguf_file::Content`: its `read` refuses the whole file as
//! soon as one tensor has a type candle has no kernel for, and the gpt-oss GGUFs
//! (ggml-org/gpt-oss-*-GGUF) hold their experts in MXFP4 (ggml type 39), which candle 0.11 does
//! not know. Its metadata reader is private, and it trusts every offset and length in the file.
//! So the header comes from our own reader ([`crate::inspect::gguf::read_full`]: every length
//! checked against the file size, tensor types kept as numbers), the bytes of each tensor are read
//! here after checking that its type, shape and byte range are what the loader expects, and
//! candle is still used for what it does well: turning the bytes of a type it knows (F32, F16,
//! BF16, Q8_0, the K-quants …) into a `QTensor` and dequantizing it. MXFP4 bytes go to the caller
//! raw (gpt-oss repacks them into the layout our kernels take).

use std::fs::File;
use std::path::{Path, PathBuf};

use candle_core::quantized::{GgmlDType, ggml_file};
use candle_core::{DType, Device, Tensor};

use crate::error::{ErrorKind, fail};
use crate::inspect::gguf::{self as header, FullMetadata, Header, TensorInfo};

/// ggml's MXFP4 type number.
pub const MXFP4: u32 = 39;

/// Elements dequantized at a time: a Q8_0 tensor is decoded in pieces of this size into its
/// output, so loading a 201088×2880 embedding does not hold its f32 copy (2.3 GB) on the device.
const DEQUANT_CHUNK: usize = 1 << 24;

/// An opened GGUF file: its checked header, its whole metadata, and the file mapped for reading.
pub struct GgufTensors {
    pub path: PathBuf,
    pub header: Header,
    pub metadata: FullMetadata,
    map: memmap2::Mmap,
}

impl GgufTensors {
    pub fn open(path: &Path) -> anyhow::Result<GgufTensors> {
        let (header, metadata) =
            header::read_full(path).map_err(|e| fail(ErrorKind::Integrity, format!("{e:#}")))?;
        let file = File::open(path)
            .map_err(|e| fail(ErrorKind::NotFound, format!("opening {}: {e}", path.display())))?;
        // SAFETY: a read-only map of a file the cache never rewrites in place (as the
        // safetensors loaders map theirs). Every range read from it is checked against its length.
        let map = unsafe { memmap2::Mmap::map(&file) }
            .map_err(|e| fail(ErrorKind::Other, format!("mapping {}: {e}", path.display())))?;
        Ok(GgufTensors { path: path.to_path_buf(), header, metadata, map })
    }

    fn corrupt(&self, msg: impl std::fmt::Display) -> anyhow::Error {
        fail(ErrorKind::Integrity, format!("{}: {msg}", self.path.display()))
    }

    pub fn info(&self, name: &str) -> Option<&TensorInfo> {
        self.header.tensors.iter().find(|t| t.name == name)
    }

    /// The info of tensor `name`, checked to have `shape` (outermost dimension first, as
    /// tensors are shaped here; GGUF lists dimensions innermost first).
    pub fn expect(&self, name: &str, shape: &[usize]) -> anyhow::Result<&TensorInfo> {
        let t = self.info(name).ok_or_else(|| self.corrupt(format!("no tensor {name}")))?;
        let dims: Vec<u64> = t.dims.iter().rev().copied().collect();
        let want: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
        if dims != want {
            return Err(
                self.corrupt(format!("tensor {name} has shape {dims:?}, expected {want:?}"))
            );
        }
        Ok(t)
    }

    /// The bytes of tensor `name`, checked to have `shape` and the ggml type `ty`.
    pub fn raw(&self, name: &str, shape: &[usize], ty: u32) -> anyhow::Result<&[u8]> {
        let t = self.expect(name, shape)?;
        if t.ggml_type != ty {
            return Err(self.corrupt(format!(
                "tensor {name} is {}, expected {}",
                header::type_name(t.ggml_type),
                header::type_name(ty)
            )));
        }
        self.bytes_of(t)
    }

    /// A tensor's bytes. The header reader checked that `offset + bytes` lies inside the file for
    /// every type whose size it knows (checked again here against the map); a type it does not
    /// know has no trustworthy size.
    fn bytes_of(&self, t: &TensorInfo) -> anyhow::Result<&[u8]> {
        if header::type_layout(t.ggml_type).is_none() {
            return Err(self.corrupt(format!(
                "tensor {} has type {}, which inferno cannot load",
                t.name,
                header::type_name(t.ggml_type)
            )));
        }
        let start = self.header.data_offset.checked_add(t.offset);
        let range = start
            .zip(start.and_then(|s| s.checked_add(t.bytes)))
            .and_then(|(s, e)| Some(usize::try_from(s).ok()?..usize::try_from(e).ok()?));
        range
            .and_then(|r| self.map.get(r))
            .ok_or_else(|| self.corrupt(format!("tensor {} lies past the end of the file", t.name)))
    }

    /// Tensor `name` (`shape`, any type candle can dequantize) as a dense `dtype` tensor on
    /// `device`. Quantized types are decoded on the device, then converted.
    pub fn dense(
        &self,
        name: &str,
        shape: &[usize],
        dtype: DType,
        device: &Device,
    ) -> anyhow::Result<Tensor> {
        let t = self.expect(name, shape)?;
        let ggml = candle_type(t.ggml_type).ok_or_else(|| {
            self.corrupt(format!(
                "tensor {name} has type {}, which inferno cannot load as a dense tensor",
                header::type_name(t.ggml_type)
            ))
        })?;
        let bytes = self.bytes_of(t)?;
        // Float types as they are: candle's CUDA `QTensor` would decode them on the host.
        let float = match ggml {
            GgmlDType::F32 => Some(DType::F32),
            GgmlDType::F16 => Some(DType::F16),
            GgmlDType::BF16 => Some(DType::BF16),
            _ => None,
        };
        if let Some(stored) = float {
            let t = Tensor::from_raw_buffer(bytes, stored, shape, &Device::Cpu)?;
            return Ok(t.to_dtype(dtype)?.to_device(device)?);
        }
        self.dequantize(name, (ggml, bytes, shape), dtype, device, DEQUANT_CHUNK)
    }

    /// Quantized bytes (of `ggml` type, `shape`) decoded on `device` about `chunk` elements (whole
    /// rows) at a time into one `dtype` tensor.
    fn dequantize(
        &self,
        name: &str,
        (ggml, bytes, shape): (GgmlDType, &[u8], &[usize]),
        dtype: DType,
        device: &Device,
        chunk: usize,
    ) -> anyhow::Result<Tensor> {
        let cols = shape.last().copied().unwrap_or(1);
        let rows = shape.iter().rev().skip(1).product::<usize>();
        // ggml quantizes along rows: a row is whole blocks (the header reader sized `bytes` as
        // rows × cols / block elements × block bytes).
        if cols % ggml.block_size() != 0 {
            return Err(self.corrupt(format!("tensor {name}: rows of {cols} are not whole blocks")));
        }
        let row_bytes = cols / ggml.block_size() * ggml.type_size();
        let piece = (chunk / cols.max(1)).max(1);
        let decode = |r0: usize, n: usize| -> anyhow::Result<Tensor> {
            let raw = &bytes[r0 * row_bytes..(r0 + n) * row_bytes];
            // `qtensor_from_ggml` reads exactly the bytes its type and shape need, unchecked:
            // `raw` is that long.
            let q = ggml_file::qtensor_from_ggml(ggml, raw, vec![n, cols], device)
                .map_err(|e| self.corrupt(format!("tensor {name}: {e}")))?;
            Ok(q.dequantize(device)?.to_dtype(dtype)?)
        };
        if rows <= piece {
            return Ok(decode(0, rows)?.reshape(shape)?);
        }
        let out = Tensor::zeros((rows, cols), dtype, device)?;
        for r0 in (0..rows).step_by(piece) {
            out.slice_set(&decode(r0, piece.min(rows - r0))?, 0, r0)?;
        }
        Ok(out.reshape(shape)?)
    }
}

/// candle's type for a ggml type number, for the types candle can build a `QTensor` of.
fn candle_type(ty: u32) -> Option<GgmlDType> {
    use GgmlDType as G;
    Some(match ty {
        0 => G::F32,
        1 => G::F16,
        2 => G::Q4_0,
        3 => G::Q4_1,
        6 => G::Q5_0,
        7 => G::Q5_1,
        8 => G::Q8_0,
        10 => G::Q2K,
        11 => G::Q3K,
        12 => G::Q4K,
        13 => G::Q5K,
        14 => G::Q6K,
        30 => G::BF16,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::{QTensor, gguf_file};

    fn write(path: &Path, tensors: &[(&str, &QTensor)]) {
        let mut f = File::create(path).unwrap();
        let arch = gguf_file::Value::String("test".into());
        let tokens = gguf_file::Value::Array(vec![gguf_file::Value::String("a".into())]);
        gguf_file::write(
            &mut f,
            &[("general.architecture", &arch), ("t.tokens", &tokens)],
            tensors,
        )
        .unwrap();
    }

    #[test]
    fn reads_what_candle_wrote() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("m.gguf");
        let cpu = Device::Cpu;
        let w = Tensor::randn(0f32, 1.0, (8, 64), &cpu).unwrap();
        let q8 = QTensor::quantize(&w, GgmlDType::Q8_0).unwrap();
        let row = w.get(0).unwrap().to_vec1::<f32>().unwrap();
        let f =
            QTensor::quantize(&Tensor::new(row.as_slice(), &cpu).unwrap(), GgmlDType::F32).unwrap();
        write(&path, &[("w", &q8), ("n", &f)]);
        let g = GgufTensors::open(&path).unwrap();
        assert!(matches!(&g.metadata["t.tokens"], gguf_file::Value::Array(a) if a.len() == 1));
        let got = g.dense("w", &[8, 64], DType::F32, &cpu).unwrap();
        let want = q8.dequantize(&cpu).unwrap();
        assert_eq!(got.to_vec2::<f32>().unwrap(), want.to_vec2::<f32>().unwrap());
        let raw = g.raw("w", &[8, 64], 8).unwrap();
        assert_eq!(raw.len(), 8 * 2 * 34);
        // In pieces of 3 rows (3 + 3 + 2), as large tensors are decoded.
        let pieces = g.dequantize("w", (GgmlDType::Q8_0, raw, &[8, 64]), DType::F32, &cpu, 3 * 64);
        assert_eq!(pieces.unwrap().to_vec2::<f32>().unwrap(), want.to_vec2::<f32>().unwrap());
        let n = g.dense("n", &[64], DType::F32, &cpu).unwrap();
        assert_eq!(n.to_vec1::<f32>().unwrap(), row);

        // Wrong shape, wrong type, missing: one line each, naming the tensor.
        let msg = |e: anyhow::Error| {
            assert_eq!(crate::error::kind_of(&e), ErrorKind::Integrity);
            format!("{e:#}")
        };
        assert!(msg(g.dense("w", &[64, 8], DType::F32, &cpu).unwrap_err()).contains("shape"));
        assert!(msg(g.raw("w", &[8, 64], MXFP4).unwrap_err()).contains("is Q8_0, expected MXFP4"));
        assert!(msg(g.dense("x", &[1], DType::F32, &cpu).unwrap_err()).contains("no tensor x"));
    }
}
