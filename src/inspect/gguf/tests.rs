use super::*;
use candle_core::quantized::{GgmlDType, QTensor, gguf_file};
use candle_core::{Device, Tensor};

fn qtensor(shape: &[usize], dtype: GgmlDType) -> QTensor {
    let t = Tensor::randn(0f32, 1f32, shape, &Device::Cpu).unwrap();
    QTensor::quantize(&t, dtype).unwrap()
}

/// Writes a real GGUF file with candle's writer (independent of the reader under test).
fn write_gguf(path: &Path, meta: &[(&str, gguf_file::Value)], tensors: &[(&str, QTensor)]) {
    let mut f = std::fs::File::create(path).unwrap();
    let meta: Vec<(&str, &gguf_file::Value)> = meta.iter().map(|(k, v)| (*k, v)).collect();
    let tensors: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (*k, v)).collect();
    gguf_file::write(&mut f, &meta, &tensors).unwrap();
}

fn llama_q4_0(path: &Path, extra_meta: Vec<(&str, gguf_file::Value)>) {
    use gguf_file::Value as V;
    let mut meta = vec![
        ("general.architecture", V::String("llama".into())),
        ("llama.context_length", V::U32(4096)),
        ("tokenizer.ggml.tokens", V::Array(vec![V::String("<s>".into()), V::String("hi".into())])),
        ("tokenizer.ggml.scores", V::Array(vec![V::F32(0.0), V::F32(-1.0)])),
    ];
    meta.extend(extra_meta);
    write_gguf(
        path,
        &meta,
        &[
            ("token_embd.weight", qtensor(&[64, 64], GgmlDType::Q8_0)),
            ("blk.0.ffn_up.weight", qtensor(&[128, 64], GgmlDType::Q4_0)),
            ("blk.0.ffn_down.weight", qtensor(&[64, 128], GgmlDType::Q4_0)),
            // 1-D and big in bytes, but norms never count towards the quant type.
            ("output_norm.weight", qtensor(&[8192], GgmlDType::F32)),
        ],
    );
}

#[test]
fn reads_metadata_and_tensor_infos() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("m.gguf");
    llama_q4_0(&path, vec![]);
    let h = read_header(&path).unwrap();
    assert_eq!(h.version, 2);
    assert_eq!(h.architecture(), Some("llama"));
    assert_eq!(h.context_length(), Some(4096));
    assert_eq!(h.metadata["tokenizer.ggml.tokens"], MetaValue::Array { len: 2 });
    assert_eq!(h.tensors.len(), 4);
    let up = h.tensors.iter().find(|t| t.name == "blk.0.ffn_up.weight").unwrap();
    assert_eq!(up.dims, vec![64, 128], "ggml order, innermost first");
    assert_eq!(type_name(up.ggml_type), "Q4_0");
    assert_eq!(up.bytes, 128 * 64 / 32 * 18);
    // Q8_0 embedding: 64*64/32*34 = 4352 bytes; Q4_0: 2 * 4608 = 9216 bytes.
    assert_eq!(h.dominant_tensor_type(), Some(2));
    assert_eq!(h.quant_label().as_deref(), Some("Q4_0"));
}

#[test]
fn full_metadata_keeps_arrays_and_agrees_with_the_header() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("m.gguf");
    llama_q4_0(&path, vec![]);
    let (h, full) = read_full(&path).unwrap();
    let candle = gguf_file::Content::read(&mut std::fs::File::open(&path).unwrap()).unwrap();
    assert_eq!(full.len(), candle.metadata.len());
    for (k, v) in &candle.metadata {
        assert_eq!(format!("{:?}", full[k]), format!("{v:?}"), "{k}");
    }
    assert_eq!(h.metadata, read_header(&path).unwrap().metadata);
    assert_eq!(h.data_offset, candle.tensor_data_offset);
}

#[test]
fn declared_file_type_wins() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("m.gguf");
    llama_q4_0(&path, vec![("general.file_type", gguf_file::Value::U32(15))]);
    assert_eq!(read_header(&path).unwrap().quant_label().as_deref(), Some("Q4_K_M"));
    // An unknown file type falls back to the tensors.
    llama_q4_0(&path, vec![("general.file_type", gguf_file::Value::U32(1024))]);
    assert_eq!(read_header(&path).unwrap().quant_label().as_deref(), Some("Q4_0"));
}

#[test]
fn tensor_types_candle_cannot_run_are_still_described() {
    // Rewrite the Q4_0 tensors' type to MXFP4 (39): same 32-element blocks, one byte less
    // each, so the data still fits. candle's own reader rejects this file.
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("m.gguf");
    llama_q4_0(&path, vec![]);
    let mut bytes = std::fs::read(&path).unwrap();
    for name in ["blk.0.ffn_up.weight", "blk.0.ffn_down.weight"] {
        let at = find(&bytes, name.as_bytes()) + name.len() + 4 + 2 * 8; // n_dims, 2 dims
        assert_eq!(bytes[at..at + 4], 2u32.to_le_bytes());
        bytes[at..at + 4].copy_from_slice(&39u32.to_le_bytes());
    }
    std::fs::write(&path, &bytes).unwrap();
    assert!(gguf_file::Content::read(&mut std::fs::File::open(&path).unwrap()).is_err());
    let h = read_header(&path).unwrap();
    assert_eq!(h.quant_label().as_deref(), Some("MXFP4 + Q8_0"), "MXFP4 first");
}

fn find(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len()).position(|w| w == needle).unwrap()
}

#[test]
fn truncated_or_foreign_files_are_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("m.gguf");
    llama_q4_0(&path, vec![]);
    let full = std::fs::read(&path).unwrap();
    for cut in [3, 20, 100, full.len() - 40] {
        std::fs::write(&path, &full[..cut]).unwrap();
        let err = format!("{:#}", read_header(&path).unwrap_err());
        assert!(err.contains("m.gguf: not a valid GGUF file"), "cut {cut}: {err}");
    }
    std::fs::write(&path, b"PK\x03\x04 this is a zip file, not a model").unwrap();
    assert!(format!("{:#}", read_header(&path).unwrap_err()).contains("magic"));
}

#[test]
fn a_vocabulary_only_file_ends_at_its_header() {
    // llama.cpp's `convert_hf_to_gguf.py --vocab-only`: no tensors, no padding after the
    // header, whose length need not be a multiple of the 32-byte alignment.
    let mut bytes = Vec::new();
    for v in [MAGIC, 3] {
        bytes.extend_from_slice(&v.to_le_bytes());
    }
    for v in [0u64, 1, 3] {
        bytes.extend_from_slice(&v.to_le_bytes()); // tensors, kvs, key length
    }
    bytes.extend_from_slice(b"k.x");
    bytes.extend_from_slice(&8u32.to_le_bytes()); // a string
    bytes.extend_from_slice(&5u64.to_le_bytes());
    bytes.extend_from_slice(b"hello");
    assert!(!bytes.len().is_multiple_of(32));
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("vocab.gguf");
    std::fs::write(&path, &bytes).unwrap();
    let (h, full) = read_full(&path).unwrap();
    assert!(h.tensors.is_empty());
    assert_eq!(h.get_str("k.x"), Some("hello"));
    assert!(matches!(&full["k.x"], Value::String(s) if s == "hello"));
}

#[test]
fn corrupt_lengths_do_not_allocate() {
    // A header claiming a 1 TB file and a 1 TB metadata key: rejected before allocating.
    let mut bytes = Vec::new();
    for v in [MAGIC, 3] {
        bytes.extend_from_slice(&v.to_le_bytes());
    }
    for v in [0u64, 1, 1 << 40] {
        bytes.extend_from_slice(&v.to_le_bytes()); // tensors, kvs, key length
    }
    let inner = BufReader::new(std::io::Cursor::new(bytes));
    let mut r = Reader { inner, pos: 0, len: 1 << 41 };
    let err = format!("{:#}", read_header_from(&mut r, None).unwrap_err());
    assert!(err.contains("corrupt length"), "{err}");
}

#[test]
fn layouts_agree_with_candle() {
    use GgmlDType as G;
    #[rustfmt::skip]
    let pairs = [
        (0, G::F32), (1, G::F16), (30, G::BF16), (2, G::Q4_0), (3, G::Q4_1), (6, G::Q5_0),
        (7, G::Q5_1), (8, G::Q8_0), (9, G::Q8_1), (10, G::Q2K), (11, G::Q3K), (12, G::Q4K),
        (13, G::Q5K), (14, G::Q6K), (15, G::Q8K),
    ];
    for (ty, dt) in pairs {
        let want = (dt.block_size() as u64, dt.type_size() as u64);
        assert_eq!(type_layout(ty), Some(want), "{dt:?}");
        assert_eq!(
            type_name(ty).replace('_', ""),
            format!("{dt:?}").to_uppercase().replace('_', "")
        );
    }
}
