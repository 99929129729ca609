//! The layering `lib.rs` describes, checked on the sources: every `crate::module` path outside a
//! comment names a module before its own in [`ORDER`], so an upward import fails here rather
//! than growing into a cycle.

use std::path::{Path, PathBuf};

/// The top-level modules, bottom up, as `lib.rs`'s first paragraph lists them.
const ORDER: [&str; 20] = [
    "error",
    "util",
    "switches",
    "test_assets",
    "gpu",
    "hub",
    "quant",
    "template",
    "generate",
    "inspect",
    "tokenizer",
    "kernels",
    "dist",
    "models",
    "engine",
    "load",
    "chat",
    "cli",
    "serve",
    "commands",
];

fn rank(module: &str) -> Option<usize> {
    ORDER.iter().position(|m| *m == module)
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("src is readable") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level modules a line of code names through `crate::` (single paths and groups like
/// `crate::{a, b::{c, d}}`), its comment left out.
fn named_modules(line: &str) -> Vec<String> {
    let code = line.split("//").next().unwrap_or("");
    let mut out = Vec::new();
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + "crate::".len()..];
        let Some(group) = rest.strip_prefix('{') else {
            out.extend(first_segment(rest));
            continue;
        };
        // Each item at the group's own depth starts with a top-level module.
        let (mut depth, mut item_start) = (1, true);
        for (j, c) in group.char_indices() {
            if item_start && depth == 1 && !c.is_whitespace() {
                out.extend(first_segment(&group[j..]));
            }
            item_start = match c {
                '{' => {
                    depth += 1;
                    false
                }
                '}' => {
                    depth -= 1;
                    false
                }
                ',' => true,
                c => item_start && c.is_whitespace(),
            };
            if depth == 0 {
                break;
            }
        }
    }
    out
}

fn first_segment(path: &str) -> Option<String> {
    let name: String =
        path.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
    (!name.is_empty()).then_some(name)
}

#[test]
fn every_module_is_placed() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let lib = std::fs::read_to_string(src.join("lib.rs")).expect("lib.rs");
    for line in lib.lines() {
        let declared = line.trim_start_matches("pub ").strip_prefix("mod ");
        if let Some(name) = declared.and_then(|d| d.strip_suffix(';'))
            && name != "layers_tests"
        {
            assert!(rank(name).is_some(), "module {name} has no place in the layers");
        }
    }
}

#[test]
fn imports_run_down_the_layers() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut upward = Vec::new();
    for file in &files {
        let rel = file.strip_prefix(&src).expect("under src");
        let top = rel.components().next().expect("a component").as_os_str().to_string_lossy();
        let top = top.trim_end_matches(".rs");
        let Some(own) = rank(top) else { continue }; // lib.rs, main.rs, this file
        let text = std::fs::read_to_string(file).expect("readable");
        for (n, line) in text.lines().enumerate() {
            for name in named_modules(line) {
                if rank(&name).is_some_and(|r| r > own) {
                    upward.push(format!("{}:{}: {top} uses {name}", rel.display(), n + 1));
                }
            }
        }
    }
    assert!(upward.is_empty(), "imports up the layers:\n{}", upward.join("\n"));
}

#[test]
fn paths_are_read_as_the_compiler_reads_them() {
    assert_eq!(named_modules("use crate::engine::core::Engine;"), ["engine"]);
    assert_eq!(named_modules("use crate::{engine, load::Spec};"), ["engine", "load"]);
    assert_eq!(named_modules("use crate::{gpu::{a, b}, hub};"), ["gpu", "hub"]);
    assert_eq!(named_modules("let x = crate::gpu::available(d); // crate::serve"), ["gpu"]);
    assert!(named_modules("/// [`crate::kernels::sample_rows`]").is_empty());
}
