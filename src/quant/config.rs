//! compressed-tensors' `quantization_config` (older files: `compression_config`) in an HF
//! `config.json`, read strictly: every field that changes what the stored tensors mean is
//! checked, and anything we do not run is refused with one line naming the field
//! (docs/quant-formats.md, "compressed-tensors"; semantics from compressed-tensors 0.20).

use regex::Regex;
use serde_json::Value;

use crate::error::{ErrorKind, fail};

/// How a projection's weight is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightFormat {
    /// int8 `weight` `[out, in]`, `weight_scale` per row (`channel`) or one (`tensor`).
    Int8,
    /// FP8 E4M3 `weight` `[out, in]`, scales as for int8.
    Fp8,
    /// 4-bit `weight_packed` int32 `[out, in/8]` (element i at bits 4·(i % 8) of word i / 8,
    /// stored as q + 8), `weight_scale` `[out, in/group]`, optional packed zero points and
    /// `weight_g_idx` (activation order).
    Int4 { group: Option<usize>, symmetric: bool, g_idx: bool },
    /// GGUF's Q8_0 (a llama.cpp file, not compressed-tensors): int8 codes in blocks of 32 input
    /// columns, each block with its own f16 scale; `q` U8 `[out, in]` in the GEMV's column order
    /// (`quant::gguf_q8`), `scale` F16 `[out, in / 32]`.
    Q8Block,
    /// GGUF's Q4_K (`quant::gguf_k`): 4-bit codes, a 6-bit scale and min per 32 columns, an f16
    /// d and dmin per 256; `q` U8 `[out, 9 in / 16]` (codes, then per-block scales), `scale`
    /// F16 `[out, 2 in / 256]`.
    Q4K,
    /// GGUF's Q6_K (`quant::gguf_k`): 6-bit codes, an int8 scale per 16 columns, an f16 d per
    /// 256; `q` U8 `[out, 13 in / 16]` (4-bit plane, 2-bit plane, scales), `scale` F16
    /// `[out, in / 256]`.
    Q6K,
}

/// What happens to a projection's input at run time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActQuant {
    /// Nothing (weight-only schemes: W4A16).
    None,
    /// Symmetric int8 per token, scale = max|x| / 127.5 (compressed-tensors' dynamic `token`).
    Int8Token,
    /// FP8 E4M3 per token, scale = max|x| / 448.
    Fp8Token,
    /// Symmetric int8 per block of 32 values, d = max|x| / 127, q = round(x / d) (half away from
    /// zero): what llama.cpp does to x before its Q8_0 dot products (`quantize_row_q8_0`), with d
    /// kept in f32.
    Int8Block,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scheme {
    pub weight: WeightFormat,
    pub act: ActQuant,
}

/// A `targets` or `ignore` entry: a class name (`Linear`), an exact module name, or `re:` plus
/// a pattern matched at the start of the name (Python's `re.match`, as compressed-tensors does).
#[derive(Debug, Clone)]
enum Target {
    Linear,
    Name(String),
    Pattern(Regex),
}

impl Target {
    fn parse(s: &str, field: &str) -> anyhow::Result<Target> {
        if let Some(p) = s.strip_prefix("re:") {
            let re = Regex::new(&format!("^(?:{p})")).map_err(|e| {
                // regex's message spans lines (the pattern, a caret); its last says why.
                let text = e.to_string();
                let why = text.lines().last().unwrap_or("").trim().to_string();
                bad(format!("{field}: {s:?} is not a regular expression we can read ({why})"))
            })?;
            return Ok(Target::Pattern(re));
        }
        Ok(if s == "Linear" { Target::Linear } else { Target::Name(s.to_string()) })
    }

    /// Whether the Linear module `name` matches (every module we ask about is a Linear).
    fn matches(&self, name: &str) -> bool {
        match self {
            Target::Linear => true,
            Target::Name(n) => n == name,
            Target::Pattern(re) => re.is_match(name),
        }
    }
}

/// A checkpoint's compressed-tensors quantization.
#[derive(Debug, Clone)]
pub struct CtConfig {
    groups: Vec<(Vec<Target>, Scheme)>,
    ignore: Vec<Target>,
}

fn bad(msg: String) -> anyhow::Error {
    fail(ErrorKind::InvalidInput, format!("config.json: {msg}"))
}

impl CtConfig {
    /// The quantization of a parsed `config.json`: `None` for a dense checkpoint, an error for
    /// any other quantization method or a compressed-tensors scheme we do not run.
    pub fn from_config(config: &Value) -> anyhow::Result<Option<CtConfig>> {
        let (key, q) = match (config.get("quantization_config"), config.get("compression_config")) {
            (Some(q), _) if !q.is_null() => ("quantization_config", q),
            (_, Some(q)) if !q.is_null() => ("compression_config", q),
            _ => return Ok(None),
        };
        let method = q.get("quant_method").and_then(Value::as_str).unwrap_or("");
        if method != "compressed-tensors" {
            return Err(bad(format!(
                "{key}.quant_method {method:?} is not supported (only compressed-tensors)"
            )));
        }
        parse(key, q).map(Some)
    }

    /// The scheme of the Linear module `name` (`model.layers.0.self_attn.q_proj`, `lm_head`),
    /// `None` when it is ignored or no group targets it (then it is stored dense).
    pub fn scheme_for(&self, name: &str) -> Option<Scheme> {
        if self.ignore.iter().any(|t| t.matches(name)) {
            return None;
        }
        self.groups.iter().find(|(targets, _)| targets.iter().any(|t| t.matches(name))).map(|g| g.1)
    }

    /// What `list` and the banners call it: `w8a8-int8`, `fp8`, `w4a16` (the first group's).
    pub fn label(&self) -> &'static str {
        self.groups.first().map_or("compressed-tensors", |(_, s)| label(s))
    }
}

/// The name of one scheme.
pub fn label(s: &Scheme) -> &'static str {
    match (s.weight, s.act) {
        (WeightFormat::Int8, ActQuant::Int8Token) => "w8a8-int8",
        (WeightFormat::Int8, _) => "w8a16-int8",
        (WeightFormat::Fp8, _) => "fp8",
        (WeightFormat::Int4 { .. }, _) => "w4a16",
        (WeightFormat::Q8Block, _) => "q8_0",
        (WeightFormat::Q4K, _) => "q4_k",
        (WeightFormat::Q6K, _) => "q6_k",
    }
}

fn parse(key: &str, q: &Value) -> anyhow::Result<CtConfig> {
    let top_format = q.get("format").and_then(Value::as_str);
    if let Some(status) = q.get("quantization_status").and_then(Value::as_str)
        && status != "compressed"
    {
        return Err(bad(format!(
            "{key}.quantization_status {status:?} is not supported (only compressed checkpoints)"
        )));
    }
    for field in ["kv_cache_scheme", "sparsity_config", "transform_config"] {
        let empty = match q.get(field) {
            None | Some(Value::Null) => true,
            Some(Value::Object(m)) => m.is_empty(),
            _ => false,
        };
        if !empty {
            return Err(bad(format!("{key}.{field} is set: not supported")));
        }
    }
    let Some(groups) = q.get("config_groups").and_then(Value::as_object) else {
        return Err(bad(format!("{key}.config_groups is missing or not an object")));
    };
    let mut parsed = Vec::new();
    for (name, g) in groups {
        let field = format!("{key}.config_groups.{name}");
        let format = g.get("format").and_then(Value::as_str).or(top_format);
        let targets = strings(g.get("targets"), &format!("{field}.targets"))?
            .iter()
            .map(|t| Target::parse(t, &format!("{field}.targets")))
            .collect::<anyhow::Result<Vec<_>>>()?;
        parsed.push((targets, scheme(&field, format, g)?));
    }
    let ignore = match q.get("ignore") {
        None | Some(Value::Null) => Vec::new(),
        v => strings(v, &format!("{key}.ignore"))?
            .iter()
            .map(|t| Target::parse(t, &format!("{key}.ignore")))
            .collect::<anyhow::Result<Vec<_>>>()?,
    };
    Ok(CtConfig { groups: parsed, ignore })
}

fn strings(v: Option<&Value>, field: &str) -> anyhow::Result<Vec<String>> {
    let list = v.and_then(Value::as_array).ok_or_else(|| bad(format!("{field} is not a list")))?;
    list.iter()
        .map(|s| {
            s.as_str()
                .map(str::to_string)
                .ok_or_else(|| bad(format!("{field}: {s} is not a string")))
        })
        .collect()
}

/// One field of a `weights` / `input_activations` object, as shown in errors.
struct Args<'a> {
    v: &'a Value,
    field: String,
}

impl Args<'_> {
    fn str(&self, k: &str) -> Option<&str> {
        self.v.get(k).and_then(Value::as_str)
    }

    fn int(&self, k: &str) -> Option<u64> {
        self.v.get(k).and_then(Value::as_u64)
    }

    fn flag(&self, k: &str, default: bool) -> bool {
        self.v.get(k).and_then(Value::as_bool).unwrap_or(default)
    }

    fn refuse(&self, k: &str, why: &str) -> anyhow::Error {
        let shown = self.v.get(k).map_or("missing".to_string(), Value::to_string);
        bad(format!("{}.{k} = {shown}: {why}", self.field))
    }

    /// `num_bits` and `type` must be these.
    fn expect(&self, bits: u64, ty: &str, format: &str) -> anyhow::Result<()> {
        if self.int("num_bits") != Some(bits) {
            return Err(self.refuse("num_bits", &format!("{format} needs {bits}")));
        }
        if self.str("type") != Some(ty) {
            return Err(self.refuse("type", &format!("{format} needs {ty:?}")));
        }
        Ok(())
    }
}

fn scheme(field: &str, format: Option<&str>, g: &Value) -> anyhow::Result<Scheme> {
    if g.get("output_activations").is_some_and(|v| !v.is_null()) {
        return Err(bad(format!("{field}.output_activations is set: not supported")));
    }
    let Some(wv) = g.get("weights").filter(|v| v.is_object()) else {
        return Err(bad(format!(
            "{field}.weights is missing: activation-only schemes are not supported"
        )));
    };
    let w = Args { v: wv, field: format!("{field}.weights") };
    if w.flag("dynamic", false) {
        return Err(w.refuse("dynamic", "dynamic weight scales are not supported"));
    }
    if w.v.get("block_structure").is_some_and(|v| !v.is_null()) {
        return Err(w.refuse("block_structure", "block scales are not supported"));
    }
    let strategy = w.str("strategy").unwrap_or("");
    let per_row = matches!(strategy, "channel" | "tensor");
    let weight = match format {
        Some("int-quantized" | "naive-quantized") => {
            w.expect(8, "int", "int-quantized")?;
            if !w.flag("symmetric", true) {
                return Err(w.refuse("symmetric", "asymmetric int8 weights are not supported"));
            }
            if !per_row {
                return Err(w.refuse("strategy", "int8 weights need \"channel\" or \"tensor\""));
            }
            WeightFormat::Int8
        }
        Some("float-quantized") => {
            w.expect(8, "float", "float-quantized")?;
            if !per_row {
                return Err(w.refuse("strategy", "FP8 weights need \"channel\" or \"tensor\""));
            }
            WeightFormat::Fp8
        }
        Some("pack-quantized") => {
            w.expect(4, "int", "pack-quantized")?;
            let group = match strategy {
                "group" => match w.int("group_size") {
                    Some(n) if n > 0 => Some(n as usize),
                    _ => {
                        return Err(
                            w.refuse("group_size", "a group strategy needs a positive size")
                        );
                    }
                },
                "channel" => None,
                _ => {
                    return Err(w.refuse("strategy", "4-bit weights need \"group\" or \"channel\""));
                }
            };
            let g_idx = match w.v.get("actorder") {
                None | Some(Value::Null) | Some(Value::Bool(false)) => false,
                Some(Value::Bool(true)) => true,
                Some(Value::String(s)) if s == "group" || s == "dynamic" => true,
                Some(Value::String(s)) if s == "weight" || s == "static" => false,
                Some(_) => return Err(w.refuse("actorder", "unknown activation order")),
            };
            WeightFormat::Int4 { group, symmetric: w.flag("symmetric", true), g_idx }
        }
        other => {
            let shown = other.map_or("missing".to_string(), |f| format!("{f:?}"));
            return Err(bad(format!(
                "{field}.format {shown} is not supported (int-quantized, naive-quantized, float-quantized, pack-quantized)"
            )));
        }
    };
    let act = match g.get("input_activations") {
        None | Some(Value::Null) => ActQuant::None,
        Some(v) => activations(&Args { v, field: format!("{field}.input_activations") }, weight)?,
    };
    Ok(Scheme { weight, act })
}

fn activations(a: &Args, weight: WeightFormat) -> anyhow::Result<ActQuant> {
    if !a.flag("dynamic", false) {
        return Err(a.refuse(
            "dynamic",
            "static activation scales (input_scale) are not supported; dynamic per-token ones are",
        ));
    }
    if a.str("strategy") != Some("token") {
        return Err(a.refuse("strategy", "only per-token dynamic activations are supported"));
    }
    if !a.flag("symmetric", true) {
        return Err(a.refuse("symmetric", "asymmetric activations are not supported"));
    }
    match weight {
        WeightFormat::Int8 => a.expect(8, "int", "int8 activations").map(|_| ActQuant::Int8Token),
        WeightFormat::Fp8 => a.expect(8, "float", "FP8 activations").map(|_| ActQuant::Fp8Token),
        WeightFormat::Int4 { .. } => {
            Err(a.refuse("num_bits", "4-bit weights run with unquantized activations only"))
        }
        WeightFormat::Q8Block | WeightFormat::Q4K | WeightFormat::Q6K => {
            Err(a.refuse("format", "GGUF block formats come from GGUF files only"))
        }
    }
}

#[cfg(test)]
mod tests;
