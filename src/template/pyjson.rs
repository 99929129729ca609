//! Python's `json.dumps`, for the `tojson` filter of chat templates.
//!
//! transformers replaces Jinja's HTML-escaping `tojson` with
//! `json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`, and tool
//! definitions reach the prompt through it, so the model was trained on Python's exact layout:
//! `", "` and `": "` separators without indent, `","` with one, `[]`/`{}` for empty containers,
//! Python float reprs (`1.0`, `1e-07`, `1e+16`), insertion-ordered keys. minijinja's own
//! `tojson` differs on all of those, hence this module.

use minijinja::value::{Kwargs, Rest, ValueKind};
use minijinja::{Error, ErrorKind, Value};
use std::fmt::Write;

/// Options of `json.dumps` that templates use.
#[derive(Debug, Clone)]
pub struct DumpOptions {
    pub ensure_ascii: bool,
    /// `None`: one line. `Some(s)`: newline and `s` repeated per level (`indent=2` → `"  "`).
    pub indent: Option<String>,
    pub item_sep: String,
    pub key_sep: String,
    pub sort_keys: bool,
}

impl DumpOptions {
    /// Python's defaults for a given indent.
    pub fn python(indent: Option<String>) -> Self {
        let item_sep = if indent.is_some() { "," } else { ", " };
        DumpOptions {
            ensure_ascii: false,
            indent,
            item_sep: item_sep.into(),
            key_sep: ": ".into(),
            sort_keys: false,
        }
    }
}

/// The `tojson` filter with HF's signature: `tojson(x, ensure_ascii=False, indent=None,
/// separators=None, sort_keys=False)`, positionally or by keyword.
pub fn tojson_filter(value: &Value, args: Rest<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let names = ["ensure_ascii", "indent", "separators", "sort_keys"];
    if args.len() > names.len() {
        return Err(Error::new(ErrorKind::TooManyArguments, "tojson takes at most 4 arguments"));
    }
    let mut opt: [Value; 4] = Default::default();
    for (i, a) in args.iter().enumerate() {
        opt[i] = a.clone();
    }
    for (i, name) in names.iter().enumerate() {
        if let Some(v) = kwargs.get::<Option<Value>>(name)? {
            opt[i] = v;
        }
    }
    kwargs.assert_all_used()?;
    let indent = match opt[1].kind() {
        ValueKind::Undefined | ValueKind::None => None,
        ValueKind::String => Some(opt[1].as_str().unwrap_or_default().to_string()),
        ValueKind::Number => {
            let n = opt[1].as_i64().ok_or_else(|| bad("indent must be an integer or a string"))?;
            Some(" ".repeat(n.max(0) as usize))
        }
        _ => return Err(bad("indent must be an integer or a string")),
    };
    let mut o = DumpOptions::python(indent);
    o.ensure_ascii = opt[0].is_true();
    o.sort_keys = opt[3].is_true();
    if !(opt[2].is_undefined() || opt[2].is_none()) {
        let seps: Vec<Value> = opt[2].try_iter()?.collect();
        match (
            seps.first().and_then(Value::as_str),
            seps.get(1).and_then(Value::as_str),
            seps.len(),
        ) {
            (Some(a), Some(b), 2) => {
                o.item_sep = a.to_string();
                o.key_sep = b.to_string();
            }
            _ => return Err(bad("separators must be a pair of strings")),
        }
    }
    let mut out = String::new();
    dump(value, &o, 0, &mut out)?;
    Ok(Value::from(out))
}

fn bad(msg: &str) -> Error {
    Error::new(ErrorKind::InvalidOperation, msg.to_string())
}

/// Deepest nesting `dump` writes: Python's `json.dumps` stops near its recursion limit of 1000
/// too, and each level is a frame of the rendering thread's stack.
const MAX_LEVEL: usize = 1000;

/// Serialises `v` like `json.dumps(v, **o)`.
pub fn dump(v: &Value, o: &DumpOptions, level: usize, out: &mut String) -> Result<(), Error> {
    if level > MAX_LEVEL {
        return Err(bad("tojson: the value is nested more than 1000 levels deep"));
    }
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            if v.is_integer() {
                let n = i128::try_from(v.clone())?;
                let _ = write!(out, "{n}");
            } else {
                out.push_str(&py_float(f64::try_from(v.clone())?));
            }
        }
        ValueKind::String => escape_into(v.as_str().unwrap_or_default(), o.ensure_ascii, out),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            container(out, o, level, '[', ']', items.len(), |i, out| {
                dump(&items[i], o, level + 1, out)
            })?;
        }
        ValueKind::Map => {
            let mut keys: Vec<Value> = v.try_iter()?.collect();
            if o.sort_keys {
                keys.sort();
            }
            container(out, o, level, '{', '}', keys.len(), |i, out| {
                let key = &keys[i];
                match key.as_str() {
                    Some(s) => escape_into(s, o.ensure_ascii, out),
                    None => {
                        // Python turns int/float/bool/None keys into their JSON text, quoted.
                        let mut k = String::new();
                        dump(key, o, level + 1, &mut k)?;
                        escape_into(&k, o.ensure_ascii, out);
                    }
                }
                out.push_str(&o.key_sep);
                dump(&v.get_item(key)?, o, level + 1, out)
            })?;
        }
        _ => {
            return Err(bad(&format!("Object of type {} is not JSON serializable", v.kind())));
        }
    }
    Ok(())
}

/// Writes `open`, the items (via `item`), `close`, with Python's layout.
fn container(
    out: &mut String,
    o: &DumpOptions,
    level: usize,
    open: char,
    close: char,
    n: usize,
    mut item: impl FnMut(usize, &mut String) -> Result<(), Error>,
) -> Result<(), Error> {
    out.push(open);
    if n == 0 {
        out.push(close);
        return Ok(());
    }
    for i in 0..n {
        if i > 0 {
            out.push_str(&o.item_sep);
        }
        if let Some(ind) = &o.indent {
            out.push('\n');
            out.push_str(&ind.repeat(level + 1));
        }
        item(i, out)?;
    }
    if let Some(ind) = &o.indent {
        out.push('\n');
        out.push_str(&ind.repeat(level));
    }
    out.push(close);
    Ok(())
}

/// A JSON string literal with Python's escapes.
fn escape_into(s: &str, ensure_ascii: bool, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0C}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ensure_ascii && !c.is_ascii()) => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Python's `repr(float)` as `json.dumps` writes it: shortest round-trip digits, positional
/// for exponents in [-4, 16), otherwise `d.ddde±XX`.
pub fn py_float(x: f64) -> String {
    if x.is_nan() {
        return "NaN".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "Infinity".into() } else { "-Infinity".into() };
    }
    if x == 0.0 {
        return if x.is_sign_negative() { "-0.0".into() } else { "0.0".into() };
    }
    // Rust's `{:e}` gives the shortest round-trip digits: "-1.2345e-7".
    let sci = format!("{x:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| c.is_ascii_digit()).collect();
    if (-4..16).contains(&exp) {
        let point = exp + 1; // digits before the decimal point
        let body = if point <= 0 {
            format!("0.{}{}", "0".repeat((-point) as usize), digits)
        } else if point as usize >= digits.len() {
            format!("{}{}.0", digits, "0".repeat(point as usize - digits.len()))
        } else {
            format!("{}.{}", &digits[..point as usize], &digits[point as usize..])
        };
        format!("{sign}{body}")
    } else {
        let frac = if digits.len() > 1 { format!(".{}", &digits[1..]) } else { String::new() };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{}{frac}e{esign}{:02}", &digits[..1], exp.abs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dumps(v: serde_json::Value, o: &DumpOptions) -> String {
        let mut out = String::new();
        dump(&Value::from(minijinja::value::Serde(&v)), o, 0, &mut out).unwrap();
        out
    }

    #[test]
    fn python_layout_and_key_order() {
        let v = serde_json::json!({"type": "function", "b": [1, 2.5, true, null], "a": {}, "e": [], "s": "é\"\n<>&'"});
        assert_eq!(
            dumps(v.clone(), &DumpOptions::python(None)),
            r#"{"type": "function", "b": [1, 2.5, true, null], "a": {}, "e": [], "s": "é\"\n<>&'"}"#
        );
        assert_eq!(
            dumps(v.clone(), &DumpOptions::python(Some("  ".into()))),
            "{\n  \"type\": \"function\",\n  \"b\": [\n    1,\n    2.5,\n    true,\n    null\n  ],\n  \"a\": {},\n  \"e\": [],\n  \"s\": \"é\\\"\\n<>&'\"\n}"
        );
        let sorted =
            DumpOptions { sort_keys: true, ensure_ascii: true, ..DumpOptions::python(None) };
        assert_eq!(
            dumps(serde_json::json!({"z": "😀", "a": 1}), &sorted),
            r#"{"a": 1, "z": "\ud83d\ude00"}"#
        );
    }

    #[test]
    fn python_float_repr() {
        for (x, want) in [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (-2.5, "-2.5"),
            (1e16, "1e+16"),
            (1.5e16, "1.5e+16"),
            (123456789012345.6, "123456789012345.6"),
            (1e-4, "0.0001"),
            (1e-5, "1e-05"),
            (-1.25e-7, "-1.25e-07"),
            (1e100, "1e+100"),
            (0.0, "0.0"),
            (100.0, "100.0"),
        ] {
            assert_eq!(py_float(x), want, "{x}");
        }
    }
}
