//! The header of a `.safetensors` file: 8-byte little-endian length, then that many bytes of
//! JSON mapping tensor names to `{dtype, shape, data_offsets}`, then the raw data.
//!
//! Reading only the header tells us the dtypes and sizes of every tensor without touching the
//! (possibly tens of GB of) data. The header is checked against the file size, so a file cut
//! short by an interrupted copy or download shows up as broken here rather than as a confusing
//! failure halfway through loading.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;

use anyhow::{Context, bail};

/// Headers are a few hundred kB even for the largest models; anything bigger is corrupt.
pub const MAX_HEADER_LEN: u64 = 100_000_000;

/// One tensor's entry in the header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorEntry {
    /// As written in the file, e.g. `BF16`, `U8`, `F8_E4M3`.
    pub dtype: String,
    pub shape: Vec<u64>,
    /// Bytes of data (`end - begin` of `data_offsets`).
    pub bytes: u64,
}

/// The parsed, validated header of one safetensors file.
#[derive(Debug, Clone, Default)]
pub struct Header {
    pub tensors: BTreeMap<String, TensorEntry>,
}

impl Header {
    /// Bytes per dtype, over all tensors.
    pub fn bytes_by_dtype(&self) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        for t in self.tensors.values() {
            *out.entry(t.dtype.clone()).or_insert(0) += t.bytes;
        }
        out
    }
}

/// Reads and validates the header of the safetensors file at `path`.
pub fn read_header(path: &Path) -> anyhow::Result<Header> {
    let mut file =
        std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let file_len = file.metadata().with_context(|| format!("reading {}", path.display()))?.len();
    let name = file_name(path);
    let header = read_header_from(&mut file, file_len)
        .with_context(|| format!("{name}: not a valid safetensors file"))?;
    Ok(header)
}

/// [`read_header`] on any reader whose total length is `file_len`.
pub fn read_header_from(reader: &mut impl Read, file_len: u64) -> anyhow::Result<Header> {
    if file_len < 8 {
        bail!("truncated: {file_len} bytes, too short for the 8-byte header length");
    }
    let mut len_bytes = [0u8; 8];
    reader.read_exact(&mut len_bytes).context("reading the header length")?;
    let header_len = u64::from_le_bytes(len_bytes);
    if header_len > MAX_HEADER_LEN {
        bail!("header length {header_len} is over the {MAX_HEADER_LEN}-byte limit (corrupt file?)");
    }
    if 8 + header_len > file_len {
        bail!("truncated: header needs {} bytes, file has {file_len}", 8 + header_len);
    }
    let mut json = vec![0u8; header_len as usize];
    reader.read_exact(&mut json).context("reading the header")?;
    let data_len = file_len - 8 - header_len;
    parse_header(&json, data_len)
}

/// Parses the JSON header and checks every tensor's data lies within `data_len` bytes.
fn parse_header(json: &[u8], data_len: u64) -> anyhow::Result<Header> {
    let value: serde_json::Value = serde_json::from_slice(json).context("header is not JSON")?;
    let map = value.as_object().context("header is not a JSON object")?;
    let mut tensors = BTreeMap::new();
    for (name, entry) in map {
        if name == "__metadata__" {
            continue;
        }
        let tensor = parse_entry(entry).with_context(|| format!("tensor {name:?}"))?;
        let end = entry_end(entry).unwrap_or(0);
        if end > data_len {
            bail!(
                "truncated: tensor {name:?} ends at data byte {end}, file has {data_len} bytes of data"
            );
        }
        tensors.insert(name.clone(), tensor);
    }
    Ok(Header { tensors })
}

fn parse_entry(entry: &serde_json::Value) -> anyhow::Result<TensorEntry> {
    let dtype = entry.get("dtype").and_then(|d| d.as_str()).context("no dtype")?.to_string();
    let shape = entry
        .get("shape")
        .and_then(|s| s.as_array())
        .context("no shape")?
        .iter()
        .map(|d| d.as_u64().context("shape is not a list of sizes"))
        .collect::<anyhow::Result<Vec<u64>>>()?;
    let offsets =
        entry.get("data_offsets").and_then(|o| o.as_array()).context("no data_offsets")?;
    let (begin, end) = match offsets.as_slice() {
        [b, e] => {
            (b.as_u64().context("bad data_offsets")?, e.as_u64().context("bad data_offsets")?)
        }
        _ => bail!("data_offsets must be [begin, end]"),
    };
    if begin > end {
        bail!("data_offsets [{begin}, {end}] run backwards");
    }
    Ok(TensorEntry { dtype, shape, bytes: end - begin })
}

fn entry_end(entry: &serde_json::Value) -> Option<u64> {
    entry.get("data_offsets")?.as_array()?.get(1)?.as_u64()
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string())
}

/// The dtype holding the most bytes, lowercased (`bf16`, `f16`, `f32`, `u8` …); `None` when
/// there are no tensors. Ties go to the alphabetically first dtype, so the answer is stable.
pub fn dominant_dtype<'a>(headers: impl IntoIterator<Item = &'a Header>) -> Option<String> {
    let mut total: BTreeMap<String, u64> = BTreeMap::new();
    for h in headers {
        for (dtype, bytes) in h.bytes_by_dtype() {
            *total.entry(dtype).or_insert(0) += bytes;
        }
    }
    let mut best: Option<(&String, u64)> = None;
    for (dtype, &bytes) in &total {
        if best.is_none_or(|(_, b)| bytes > b) {
            best = Some((dtype, bytes));
        }
    }
    best.map(|(d, _)| d.to_lowercase())
}

/// Test helper: writes a real safetensors file with tensors `(name, dtype, shape, bytes per
/// element)`, data all zeros.
#[cfg(test)]
pub(crate) fn write_test_file(
    path: &Path,
    tensors: &[(&str, &str, &[u64], u64)],
) -> std::io::Result<()> {
    let mut header = serde_json::Map::new();
    let mut offset = 0u64;
    for (name, dtype, shape, elem_size) in tensors {
        let bytes = shape.iter().product::<u64>() * elem_size;
        header.insert(
            name.to_string(),
            serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + bytes]}),
        );
        offset += bytes;
    }
    header.insert("__metadata__".into(), serde_json::json!({"format": "pt"}));
    let json = serde_json::Value::Object(header).to_string();
    let mut out = Vec::new();
    out.extend_from_slice(&(json.len() as u64).to_le_bytes());
    out.extend_from_slice(json.as_bytes());
    out.resize(out.len() + offset as usize, 0);
    std::fs::write(path, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bf16_llama(dir: &Path) -> std::path::PathBuf {
        let path = dir.join("model.safetensors");
        write_test_file(
            &path,
            &[
                ("model.embed_tokens.weight", "BF16", &[64, 16], 2),
                ("model.layers.0.mlp.up_proj.weight", "BF16", &[32, 16], 2),
                ("model.norm.weight", "F32", &[16], 4),
            ],
        )
        .unwrap();
        path
    }

    #[test]
    fn reads_dtypes_shapes_and_sizes() {
        let tmp = tempfile::tempdir().unwrap();
        let header = read_header(&bf16_llama(tmp.path())).unwrap();
        assert_eq!(header.tensors.len(), 3, "__metadata__ is not a tensor");
        let embed = &header.tensors["model.embed_tokens.weight"];
        assert_eq!(embed.dtype, "BF16");
        assert_eq!(embed.shape, vec![64, 16]);
        assert_eq!(embed.bytes, 64 * 16 * 2);
        assert_eq!(header.bytes_by_dtype()["F32"], 64);
        assert_eq!(dominant_dtype([&header]).as_deref(), Some("bf16"));
    }

    #[test]
    fn dominant_dtype_counts_bytes_not_tensors() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("m.safetensors");
        // Three small F16 tensors, one big F32 one: F32 has more bytes.
        write_test_file(
            &path,
            &[
                ("a", "F16", &[4], 2),
                ("b", "F16", &[4], 2),
                ("c", "F16", &[4], 2),
                ("d", "F32", &[100], 4),
            ],
        )
        .unwrap();
        assert_eq!(dominant_dtype([&read_header(&path).unwrap()]).as_deref(), Some("f32"));
        assert_eq!(dominant_dtype(std::iter::empty::<&Header>()), None);
    }

    #[test]
    fn truncated_data_is_an_error() {
        let tmp = tempfile::tempdir().unwrap();
        let path = bf16_llama(tmp.path());
        let full = std::fs::read(&path).unwrap();
        std::fs::write(&path, &full[..full.len() - 10]).unwrap();
        let err = format!("{:#}", read_header(&path).unwrap_err());
        assert!(err.contains("model.safetensors") && err.contains("truncated"), "{err}");
    }

    #[test]
    fn truncated_header_is_an_error() {
        let tmp = tempfile::tempdir().unwrap();
        let path = bf16_llama(tmp.path());
        let full = std::fs::read(&path).unwrap();
        std::fs::write(&path, &full[..40]).unwrap();
        let err = format!("{:#}", read_header(&path).unwrap_err());
        assert!(err.contains("truncated: header needs"), "{err}");
        std::fs::write(&path, &full[..5]).unwrap();
        let err = format!("{:#}", read_header(&path).unwrap_err());
        assert!(err.contains("too short"), "{err}");
    }

    #[test]
    fn absurd_header_length_is_rejected_without_allocating() {
        let mut bytes = u64::MAX.to_le_bytes().to_vec();
        bytes.extend_from_slice(b"{}");
        let err = read_header_from(&mut bytes.as_slice(), bytes.len() as u64).unwrap_err();
        assert!(err.to_string().contains("limit"), "{err}");
    }

    #[test]
    fn garbage_is_an_error() {
        let cases: [&[u8]; 4] = [
            b"not json",
            br#"[1, 2]"#,
            br#"{"w": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}}"#,
            br#"{"w": {"dtype": "F32", "shape": "x", "data_offsets": [0, 8]}}"#,
        ];
        for json in cases {
            let mut bytes = (json.len() as u64).to_le_bytes().to_vec();
            bytes.extend_from_slice(json);
            bytes.extend_from_slice(&[0; 8]);
            let len = bytes.len() as u64;
            assert!(
                read_header_from(&mut bytes.as_slice(), len).is_err(),
                "{}",
                String::from_utf8_lossy(json)
            );
        }
    }
}
