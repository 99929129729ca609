//! The layering `lib.rs` describes, checked on the sources: every `crate::module` path outside a
//! comment names a module before its own in [`ORDER`], so an upward import fails here rather
//! than growing into a cycle. And an architecture is its folder under `models/`: no code outside
//! `models/` matches on architectures, `load` names no architecture folder (it asks
//! `models::registry`), and the folders' imports of each other form no loop. And in `serve/`
//! and `chat/reply/`, no child imports an item from its parent's `mod.rs` (which declares and
//! uses the children): what the children share lives in a child of its own. And in `engine/`
//! and `engine/spec/`, the children's imports of each other form no loop.

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
    named_after(line, "crate::")
}

/// The first segments of the paths a line of code continues after `prefix`, as
/// [`named_modules`] reads them after `crate::`.
fn named_after(line: &str, prefix: &str) -> Vec<String> {
    let code = line.split("//").next().unwrap_or("");
    let mut out = Vec::new();
    for (i, _) in code.match_indices(prefix) {
        let rest = &code[i + prefix.len()..];
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
    assert_eq!(named_after("use super::{gpt_oss, llama};", "super::"), ["gpt_oss", "llama"]);
    let config = "use crate::models::llama::config::LlamaConfig;";
    assert_eq!(named_after(config, "crate::models::"), ["llama"]);
}

/// The architecture folders: the directories under `src/models/`.
fn architecture_folders(src: &Path) -> Vec<String> {
    let dirs = std::fs::read_dir(src.join("models")).expect("src/models is readable");
    let mut out: Vec<String> = dirs
        .map(|e| e.expect("entry").path())
        .filter(|p| p.is_dir())
        .map(|p| p.file_name().expect("a name").to_string_lossy().into_owned())
        .collect();
    out.sort();
    out
}

/// Every source file with its path under `src/` and its text.
fn sources(src: &Path) -> Vec<(PathBuf, String)> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    files
        .into_iter()
        .map(|f| {
            let text = std::fs::read_to_string(&f).expect("readable");
            (f.strip_prefix(src).expect("under src").to_path_buf(), text)
        })
        .collect()
}

#[test]
fn no_architecture_is_matched_outside_models() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut found = Vec::new();
    for (rel, text) in sources(&src) {
        if rel.starts_with("models") || rel == Path::new("layers_tests.rs") {
            continue;
        }
        for (n, line) in text.lines().enumerate() {
            if line.split("//").next().unwrap_or("").contains("Arch::") {
                found.push(format!("{}:{}", rel.display(), n + 1));
            }
        }
    }
    assert!(found.is_empty(), "architectures matched outside src/models/:\n{}", found.join("\n"));
}

#[test]
fn load_names_no_architecture() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let folders = architecture_folders(&src);
    let mut found = Vec::new();
    // Its tests may build a model of a named architecture to hold the plan against.
    let is_test =
        |rel: &Path| rel.file_stem().is_some_and(|s| s.to_string_lossy().ends_with("tests"));
    let code =
        sources(&src).into_iter().filter(|(rel, _)| rel.starts_with("load") && !is_test(rel));
    for (rel, text) in code {
        for (n, line) in text.lines().enumerate() {
            for name in named_after(line, "models::").into_iter().filter(|m| folders.contains(m)) {
                found.push(format!("{}:{}: {name}", rel.display(), n + 1));
            }
        }
    }
    assert!(found.is_empty(), "load names architecture folders:\n{}", found.join("\n"));
}

/// Which architecture folders each one imports, and which the shared files beside them do: only
/// the registry names them there, and the folders' imports form no loop.
#[test]
fn no_import_loop_crosses_an_architecture_folder() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let folders = architecture_folders(&src);
    let mut edges: Vec<(String, String)> = Vec::new();
    let mut shared = Vec::new();
    for (rel, text) in sources(&src) {
        let mut parts = rel.components().map(|c| c.as_os_str().to_string_lossy().into_owned());
        if parts.next().as_deref() != Some("models") {
            continue;
        }
        let Some(own) = parts.next() else { continue };
        let in_folder = folders.contains(&own);
        // `models::` as a relative path: `super::` in a shared file or a folder's `mod.rs`,
        // `super::super::` in a folder's other files.
        let up = match rel.file_name().is_some_and(|f| f == "mod.rs") || !in_folder {
            true => "super::",
            false => "super::super::",
        };
        for (n, line) in text.lines().enumerate() {
            let mut names = named_after(line, "crate::models::");
            names.extend(named_after(line, up));
            for name in names.into_iter().filter(|m| folders.contains(m) && *m != own) {
                match in_folder {
                    true => edges.push((own.clone(), name)),
                    false if own == "registry.rs" || own == "mod.rs" => {}
                    false => shared.push(format!("{}:{}: {name}", rel.display(), n + 1)),
                }
            }
        }
    }
    assert!(shared.is_empty(), "shared model code names architectures:\n{}", shared.join("\n"));
    edges.sort();
    edges.dedup();
    let looped = on_a_loop(&edges);
    assert!(looped.is_empty(), "architecture folders import each other in a loop: {looped:?}");
}

/// The imports of `edges` (importer, imported) that lie on a loop: those whose imported module
/// reaches back to the importer.
fn on_a_loop(edges: &[(String, String)]) -> Vec<&(String, String)> {
    let reaches = |from: &str, to: &str| {
        let (mut seen, mut next) = (vec![from.to_string()], vec![from.to_string()]);
        while let Some(f) = next.pop() {
            for (_, b) in edges.iter().filter(|(a, _)| *a == f) {
                if !seen.contains(b) {
                    seen.push(b.clone());
                    next.push(b.clone());
                }
            }
        }
        seen.iter().any(|s| s == to)
    };
    edges.iter().filter(|(a, b)| reaches(b, a)).collect()
}

/// The folders whose children import each other in no loop: what two of them share lives in
/// the lower one.
const NO_LOOP_AMONG_CHILDREN: [&str; 2] = ["engine", "engine/spec"];

/// Which children of `folder` (under `src/`) each of its children imports, by `crate::` paths
/// and by `super::` chains that reach the folder (their tests left out).
fn child_imports(src: &Path, folder: &str) -> Vec<(String, String)> {
    let root: Vec<String> = folder.split('/').map(str::to_string).collect();
    let crate_prefix = format!("crate::{}::", root.join("::"));
    let mut edges = Vec::new();
    for (rel, text) in sources(src) {
        let own = module_path(&rel);
        if own.len() <= root.len() || own[..root.len()] != root[..] {
            continue;
        }
        let child = &own[root.len()];
        let code = text.split("#[cfg(test)]").next().unwrap_or("");
        for line in code.lines() {
            let line = line.split("//").next().unwrap_or("");
            let mut names = named_after(line, &crate_prefix);
            let to_root =
                super_paths(line).into_iter().filter(|(ups, _)| own.len() == root.len() + ups);
            names.extend(to_root.map(|(_, name)| name));
            for name in names.into_iter().filter(|n| n != child && has_child(src, &root, n)) {
                edges.push((child.clone(), name));
            }
        }
    }
    edges.sort();
    edges.dedup();
    edges
}

#[test]
fn no_import_loop_among_a_folders_children() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    for folder in NO_LOOP_AMONG_CHILDREN {
        let edges = child_imports(&src, folder);
        assert!(!edges.is_empty(), "{folder}: no imports among its children were read");
        let looped = on_a_loop(&edges);
        assert!(
            looped.is_empty(),
            "the children of {folder} import each other in a loop: {looped:?}"
        );
    }
}

/// The folders whose children take nothing from their parent module's own file: a `mod.rs`
/// declares its children and may use them, so a child that imports an item from it closes a
/// loop (serve's handlers once took `body_bytes` and `check_prompt` from `serve/mod.rs`).
const NO_LOOP_WITH_PARENT: [&str; 2] = ["serve", "chat/reply"];

/// The module path of a source file under `src/`: `serve/messages/mod.rs` is `serve::messages`.
fn module_path(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> =
        rel.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
    let last = parts.pop().expect("a file name");
    if last != "mod.rs" {
        parts.push(last.trim_end_matches(".rs").to_string());
    }
    parts
}

/// Whether the module at `path` (under `src/`) has a child module `name`.
fn has_child(src: &Path, path: &[String], name: &str) -> bool {
    let dir = path.iter().fold(src.to_path_buf(), |d, p| d.join(p));
    dir.join(format!("{name}.rs")).is_file() || dir.join(name).is_dir()
}

/// The paths a line of code names through `super::` chains: (how many `super`s, the first
/// segment after them).
fn super_paths(code: &str) -> Vec<(usize, String)> {
    const SUPER: &str = "super::";
    let mut out = Vec::new();
    for (i, _) in code.match_indices(SUPER) {
        if code[..i].ends_with(SUPER) {
            continue; // inside a chain already counted
        }
        let mut rest = &code[i..];
        let mut ups = 0;
        while let Some(r) = rest.strip_prefix(SUPER) {
            rest = r;
            ups += 1;
        }
        let names = named_after(&format!("@::{rest}"), "@::");
        out.extend(names.into_iter().map(|n| (ups, n)));
    }
    out
}

#[test]
fn no_child_takes_items_from_its_parents_mod_rs() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut found = Vec::new();
    for (rel, text) in sources(&src) {
        let Some(root) = NO_LOOP_WITH_PARENT.iter().find(|r| rel.starts_with(r)) else { continue };
        let root: Vec<String> = root.split('/').map(str::to_string).collect();
        let own = module_path(&rel);
        let crate_prefix = format!("crate::{}::", root.join("::"));
        // Tests (a `mod tests` at the end of the file) see their own file as `super`.
        let code = text.split("#[cfg(test)]").next().unwrap_or("");
        for (n, line) in code.lines().enumerate() {
            let line = line.split("//").next().unwrap_or("");
            let mut named: Vec<(Vec<String>, String)> = super_paths(line)
                .into_iter()
                .filter(|(ups, _)| *ups <= own.len())
                .map(|(ups, name)| (own[..own.len() - ups].to_vec(), name))
                .collect();
            named.extend(named_after(line, &crate_prefix).into_iter().map(|m| (root.clone(), m)));
            for (parent, name) in named {
                let inside = parent.len() >= root.len() && parent[..root.len()] == root[..];
                if inside && own.starts_with(&parent) && !has_child(&src, &parent, &name) {
                    found.push(format!(
                        "{}:{}: {name} from {}",
                        rel.display(),
                        n + 1,
                        parent.join("::")
                    ));
                }
            }
        }
    }
    assert!(found.is_empty(), "children import their parent module's items:\n{}", found.join("\n"));
}

#[test]
fn super_chains_are_read_whole() {
    assert_eq!(super_paths("use super::super::errors::ApiError;"), [(2, "errors".to_string())]);
    assert_eq!(
        super_paths("use super::{body_bytes, sse::X};"),
        [(1, "body_bytes".to_string()), (1, "sse".to_string())]
    );
    assert_eq!(module_path(Path::new("serve/messages/mod.rs")), ["serve", "messages"]);
    assert_eq!(module_path(Path::new("serve/chat.rs")), ["serve", "chat"]);
}

#[test]
fn loops_are_found() {
    let e = |a: &str, b: &str| (a.to_string(), b.to_string());
    let edges = [e("core", "spec"), e("spec", "pool"), e("pool", "core"), e("core", "kv")];
    let looped: Vec<&str> = on_a_loop(&edges).iter().map(|(a, _)| a.as_str()).collect();
    assert_eq!(looped, ["core", "spec", "pool"]);
}
