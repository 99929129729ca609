//! Disk usage and health of cached snapshots, for `inferno list`.
//!
//! A snapshot is a tree of symlinks into `blobs/`; its size is that of the distinct blobs it
//! points to (two snapshots sharing a blob each count it, as `hf cache scan` does per
//! revision). A link whose blob is gone (a cache cleaned by hand, a download killed between
//! the blob and the link) is reported, never fatal: listing must work on any cache.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use super::RepoCache;

/// What the files of one snapshot amount to on disk.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Usage {
    /// Bytes of the distinct files (blobs) reached through the snapshot.
    pub size: u64,
    /// Newest modification time among those files.
    pub modified: Option<SystemTime>,
    /// Number of distinct files.
    pub files: usize,
    /// Snapshot-relative paths (with `/`) whose target does not exist, sorted.
    pub missing: Vec<String>,
}

/// Walks `dir` (a snapshot folder), following file symlinks but not directory ones.
pub fn usage(dir: &Path) -> std::io::Result<Usage> {
    let mut usage = Usage::default();
    let mut seen = HashSet::new();
    walk(dir, dir, &mut usage, &mut seen)?;
    usage.missing.sort();
    Ok(usage)
}

fn walk(
    root: &Path,
    dir: &Path,
    usage: &mut Usage,
    seen: &mut HashSet<PathBuf>,
) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        if entry.file_type()?.is_dir() {
            walk(root, &path, usage, seen)?;
            continue;
        }
        let meta = match std::fs::metadata(&path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                usage.missing.push(relative(root, &path));
                continue;
            }
            Err(e) => return Err(e),
        };
        if meta.is_dir() || !seen.insert(std::fs::canonicalize(&path)?) {
            continue;
        }
        usage.size += meta.len();
        usage.files += 1;
        if let Ok(t) = meta.modified() {
            usage.modified = usage.modified.max(Some(t));
        }
    }
    Ok(())
}

fn relative(root: &Path, path: &Path) -> String {
    let rel = path.strip_prefix(root).unwrap_or(path);
    rel.components().map(|c| c.as_os_str().to_string_lossy()).collect::<Vec<_>>().join("/")
}

/// Bytes in `blobs/`, for a repo folder that has no usable snapshot.
pub fn blobs_size(repo: &RepoCache) -> u64 {
    let Ok(entries) = std::fs::read_dir(repo.blobs_dir()) else { return 0 };
    entries
        .flatten()
        .filter_map(|e| e.metadata().ok())
        .filter(|m| m.is_file())
        .map(|m| m.len())
        .sum()
}

/// Which refs (`main`, `v1.0`, `pr/3`) point at each commit, from the files under `refs/`.
pub fn refs_by_commit(repo: &RepoCache) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let root = repo.dir.join("refs");
    let mut stack = vec![root.clone()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries.flatten() {
            let path = entry.path();
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(path);
            } else if let Ok(commit) = std::fs::read_to_string(&path) {
                out.entry(commit.trim().to_string()).or_default().push(relative(&root, &path));
            }
        }
    }
    for names in out.values_mut() {
        // `main` first, then alphabetical.
        names.sort_by_key(|n| (n != "main", n.clone()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hub::{Cache, RepoId};

    const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

    #[test]
    fn counts_distinct_blobs_and_reports_dangling_links() {
        let tmp = tempfile::tempdir().unwrap();
        let repo = Cache::new(tmp.path()).repo(&RepoId::parse("org/m").unwrap());
        std::fs::create_dir_all(repo.blobs_dir()).unwrap();
        std::fs::write(repo.blob_path("a"), vec![0u8; 100]).unwrap();
        std::fs::write(repo.blob_path("b"), vec![0u8; 20]).unwrap();
        repo.link_snapshot_file(COMMIT, "model.safetensors", "a").unwrap();
        repo.link_snapshot_file(COMMIT, "original/model.safetensors", "a").unwrap(); // same blob
        repo.link_snapshot_file(COMMIT, "config.json", "b").unwrap();
        repo.link_snapshot_file(COMMIT, "sub/tokenizer.json", "gone").unwrap();
        let u = usage(&repo.snapshot_dir(COMMIT)).unwrap();
        assert_eq!((u.size, u.files), (120, 2));
        assert_eq!(u.missing, vec!["sub/tokenizer.json".to_string()]);
        let blob_time = std::fs::metadata(repo.blob_path("a")).unwrap().modified().unwrap();
        assert!(u.modified.unwrap() >= blob_time);
        assert_eq!(blobs_size(&repo), 120);
    }

    #[test]
    fn refs_map_to_commits() {
        let tmp = tempfile::tempdir().unwrap();
        let repo = Cache::new(tmp.path()).repo(&RepoId::parse("org/m").unwrap());
        repo.write_ref("v1", COMMIT).unwrap();
        repo.write_ref("main", COMMIT).unwrap();
        repo.write_ref("refs/pr/3", "f".repeat(40).as_str()).unwrap();
        let refs = refs_by_commit(&repo);
        assert_eq!(refs[COMMIT], vec!["main".to_string(), "v1".to_string()]);
        assert_eq!(refs[&"f".repeat(40)], vec!["refs/pr/3".to_string()]);
    }
}
