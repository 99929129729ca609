//! `inferno list`: every model in the Hugging Face cache, one row per cached revision,
//! whichever tool downloaded it.
//!
//! Output, by where stdout goes:
//! - a terminal: an aligned table with a header, columns MODEL, REVISION (first 7 characters of
//!   the commit, plus the refs that point at it, e.g. `1a2b3c4 (main)`), SIZE, MODIFIED (age of
//!   the newest file, `3 days ago`), ARCH, CONTEXT, FORMAT. FORMAT is last because a broken
//!   entry puts its reason there (`broken: …`), which may be long.
//! - a pipe or file: tab-separated lines, no header, raw values for scripts: model, full
//!   commit, refs (comma-separated), size in bytes, modified (RFC 3339, UTC), architecture,
//!   context length, format. Unknown values are `-`.
//! - `--json`: an array of objects with the same facts and an `error` field (null unless the
//!   entry is broken); `[]` for an empty cache.
//!
//! Rows are sorted by model id (case-insensitive), then newest revision first. A broken entry
//! (no snapshot, dangling symlink, corrupt header or config) gets a row saying what is wrong
//! and never fails the command. An empty or missing cache prints a hint on stderr and exits 0.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::SystemTime;

use anyhow::Context;
use serde::Serialize;

use crate::cli::ListArgs;
use crate::hub::scan;
use crate::hub::{Cache, RepoCache};
use crate::inspect::{self, ModelDescription};
use crate::util::table::Table;
use crate::util::{human_age, human_bytes, rfc3339};

/// Suggested in the empty-cache hint: small enough to fetch in seconds.
const EXAMPLE_MODEL: &str = "HuggingFaceTB/SmolLM2-135M-Instruct";

/// One cached revision of a model (or a repo folder with no usable revision).
#[derive(Debug, Clone)]
pub struct Row {
    pub model: String,
    /// `None` when the repo folder has no snapshot at all.
    pub commit: Option<String>,
    /// Refs pointing at `commit`, `main` first.
    pub refs: Vec<String>,
    /// The snapshot folder.
    pub path: Option<PathBuf>,
    /// Bytes of the distinct files the snapshot uses (of `blobs/` when there is no snapshot).
    pub size: u64,
    pub modified: Option<SystemTime>,
    /// What the model is, or why it cannot be used.
    pub info: Result<ModelDescription, String>,
}

pub fn run(args: ListArgs) -> anyhow::Result<()> {
    let cache = Cache::from_env();
    let rows = collect(&cache)?;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    if rows.is_empty() {
        eprintln!(
            "no models in {}; download one with: inferno download {EXAMPLE_MODEL}",
            cache.root().display()
        );
    }
    let text = if args.json {
        render_json(&rows)?
    } else if rows.is_empty() {
        String::new()
    } else if stdout.is_terminal() {
        render_table(&rows, SystemTime::now())
    } else {
        render_tsv(&rows)
    };
    out.write_all(text.as_bytes())?;
    out.flush()?;
    Ok(())
}

/// Every row for the cache at `cache`, sorted. Fails only if the cache root cannot be read.
pub fn collect(cache: &Cache) -> anyhow::Result<Vec<Row>> {
    let repos = cache
        .repos()
        .with_context(|| format!("reading the cache at {}", cache.root().display()))?;
    Ok(repos.iter().flat_map(repo_rows).collect())
}

fn repo_rows(repo: &RepoCache) -> Vec<Row> {
    let refs = scan::refs_by_commit(repo);
    let commits: Vec<String> = match repo.snapshots() {
        Ok(c) => c.into_iter().filter(|c| repo.snapshot_dir(c).is_dir()).collect(),
        Err(e) => return vec![repo_row(repo, format!("cannot read snapshots: {e}"))],
    };
    if commits.is_empty() {
        return vec![repo_row(repo, "no snapshot (incomplete download?)".to_string())];
    }
    let mut rows: Vec<Row> = commits
        .into_iter()
        .map(|commit| {
            let r = refs.get(&commit).cloned().unwrap_or_default();
            snapshot_row(repo, commit, r)
        })
        .collect();
    // Newest first; the folder-mtime order of `snapshots()` breaks ties.
    rows.sort_by_key(|r| std::cmp::Reverse(r.modified));
    rows
}

/// A row for a repo folder that has no usable snapshot.
fn repo_row(repo: &RepoCache, error: String) -> Row {
    Row {
        model: repo.id.to_string(),
        commit: None,
        refs: Vec::new(),
        path: None,
        size: scan::blobs_size(repo),
        modified: None,
        info: Err(error),
    }
}

fn snapshot_row(repo: &RepoCache, commit: String, refs: Vec<String>) -> Row {
    let dir = repo.snapshot_dir(&commit);
    let (usage, info) = match scan::usage(&dir) {
        Err(e) => (scan::Usage::default(), Err(format!("cannot read snapshot: {e}"))),
        Ok(u) if !u.missing.is_empty() => {
            let more = match u.missing.len() {
                1 => String::new(),
                n => format!(" and {} more", n - 1),
            };
            let reason = format!("missing blob for {}{more}", u.missing[0]);
            (u, Err(reason))
        }
        Ok(u) => (u, inspect::inspect(&dir).map_err(|e| format!("{e:#}"))),
    };
    Row {
        model: repo.id.to_string(),
        commit: Some(commit),
        refs,
        path: Some(dir),
        size: usage.size,
        modified: usage.modified,
        info,
    }
}

/// One element of the `--json` array; fields in this order, all always present.
#[derive(Debug, Serialize)]
struct JsonRow<'a> {
    model: &'a str,
    commit: Option<&'a str>,
    refs: &'a [String],
    path: Option<String>,
    size_bytes: u64,
    /// RFC 3339, UTC.
    modified: Option<String>,
    architecture: Option<&'a str>,
    format: Option<&'a str>,
    context_length: Option<u64>,
    /// Why the entry is unusable; null when it is fine.
    error: Option<&'a str>,
}

/// The `--json` array, pretty-printed, ending in a newline.
pub fn render_json(rows: &[Row]) -> anyhow::Result<String> {
    let items: Vec<JsonRow> = rows
        .iter()
        .map(|r| {
            let info = r.info.as_ref().ok();
            JsonRow {
                model: &r.model,
                commit: r.commit.as_deref(),
                refs: &r.refs,
                path: r.path.as_ref().map(|p| p.display().to_string()),
                size_bytes: r.size,
                modified: r.modified.and_then(rfc3339),
                architecture: info.and_then(|i| i.architecture.as_deref()),
                format: info.map(|i| i.format.as_str()),
                context_length: info.and_then(|i| i.context_length),
                error: r.info.as_ref().err().map(String::as_str),
            }
        })
        .collect();
    let mut text = serde_json::to_string_pretty(&items)?;
    text.push('\n');
    Ok(text)
}

/// The terminal table; ages are relative to `now`.
pub fn render_table(rows: &[Row], now: SystemTime) -> String {
    let mut table = Table::new(&[
        ("MODEL", false),
        ("REVISION", false),
        ("SIZE", true),
        ("MODIFIED", false),
        ("ARCH", false),
        ("CONTEXT", true),
        ("FORMAT", false),
    ]);
    for r in rows {
        let revision = match (&r.commit, r.refs.is_empty()) {
            (None, _) => "-".to_string(),
            (Some(c), true) => short(c).to_string(),
            (Some(c), false) => format!("{} ({})", short(c), r.refs.join(", ")),
        };
        let (arch, context, format) = describe(r);
        table.push(vec![
            r.model.clone(),
            revision,
            human_bytes(r.size),
            r.modified.map_or_else(|| "-".to_string(), |t| human_age(t, now)),
            arch,
            context,
            one_line(&format),
        ]);
    }
    table.render()
}

/// Tab-separated lines, raw values, no header (see the module doc).
pub fn render_tsv(rows: &[Row]) -> String {
    let dash = |s: Option<String>| s.unwrap_or_else(|| "-".to_string());
    let mut out = String::new();
    for r in rows {
        let (arch, context, format) = describe(r);
        let refs = if r.refs.is_empty() { "-".to_string() } else { r.refs.join(",") };
        let fields = [
            r.model.clone(),
            dash(r.commit.clone()),
            refs,
            r.size.to_string(),
            dash(r.modified.and_then(rfc3339)),
            arch,
            context,
            format,
        ];
        let fields: Vec<String> = fields.iter().map(|f| one_line(f).replace('\t', " ")).collect();
        out.push_str(&fields.join("\t"));
        out.push('\n');
    }
    out
}

/// (architecture, context length, format) as shown, `-` for unknown.
fn describe(r: &Row) -> (String, String, String) {
    match &r.info {
        Ok(i) => (
            i.architecture.clone().unwrap_or_else(|| "-".to_string()),
            i.context_length.map_or_else(|| "-".to_string(), |c| c.to_string()),
            i.format.clone(),
        ),
        Err(e) => ("-".to_string(), "-".to_string(), format!("broken: {e}")),
    }
}

fn short(commit: &str) -> &str {
    commit.get(..7).unwrap_or(commit)
}

/// Control characters (from file names or messages) would break the line-based outputs.
fn one_line(s: &str) -> String {
    s.chars().map(|c| if c.is_control() && c != '\t' { ' ' } else { c }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn row(info: Result<ModelDescription, String>) -> Row {
        Row {
            model: "org/m".into(),
            commit: Some("0123456789abcdef0123456789abcdef01234567".into()),
            refs: vec!["main".into()],
            path: None,
            size: 1_500_000,
            modified: Some(SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000)),
            info,
        }
    }

    fn info() -> ModelDescription {
        ModelDescription {
            architecture: Some("llama".into()),
            format: "bf16".into(),
            context_length: Some(2048),
            weights: inspect::WeightKind::Safetensors,
            weight_files: vec![],
        }
    }

    #[test]
    fn table_rows() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + 3 * 86400);
        let text =
            render_table(&[row(Ok(info())), row(Err("missing blob for\nconfig.json".into()))], now);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(
            lines[0]
                .starts_with("MODEL  REVISION          SIZE  MODIFIED    ARCH   CONTEXT  FORMAT"),
            "{text}"
        );
        assert!(
            lines[1].starts_with("org/m  0123456 (main)  1.5 MB  3 days ago  llama     2048  bf16"),
            "{text}"
        );
        assert!(lines[2].ends_with("-  broken: missing blob for config.json"), "{text}");
    }

    #[test]
    fn json_keeps_field_order_and_nulls() {
        let text = render_json(&[row(Err("no snapshot".into()))]).unwrap();
        let keys: Vec<&str> =
            text.lines().filter_map(|l| l.trim().strip_prefix('"')?.split('"').next()).collect();
        let want = [
            "model",
            "commit",
            "refs",
            "main",
            "path",
            "size_bytes",
            "modified",
            "architecture",
            "format",
            "context_length",
            "error",
        ];
        assert_eq!(keys, want, "{text}");
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v[0]["format"], serde_json::Value::Null);
        assert_eq!(v[0]["error"], "no snapshot");
        assert_eq!(v[0]["modified"], "2023-11-14T22:13:20Z");
    }

    #[test]
    fn tsv_rows() {
        let text = render_tsv(&[row(Ok(info())), row(Err("bad\tthing".into()))]);
        let lines: Vec<Vec<&str>> = text.lines().map(|l| l.split('\t').collect()).collect();
        assert_eq!(
            lines[0],
            [
                "org/m",
                "0123456789abcdef0123456789abcdef01234567",
                "main",
                "1500000",
                "2023-11-14T22:13:20Z",
                "llama",
                "2048",
                "bf16"
            ]
        );
        assert_eq!(lines[1][7], "broken: bad thing");
        assert_eq!(lines[1].len(), 8);
    }
}
