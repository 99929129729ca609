//! The standard Hugging Face cache layout, shared with `huggingface_hub`, vLLM, mistral.rs …
//!
//! ```text
//! <root>/models--org--name/
//!     blobs/<etag>                 file contents, named by git-sha1 or LFS sha256
//!     blobs/<etag>.incomplete      a download in progress (resumable)
//!     snapshots/<commit>/<file>    relative symlink -> ../../blobs/<etag>
//!     refs/<revision>              the commit a branch/tag resolved to
//! ```
//! Keeping exactly this layout is what lets other tools' downloads show up in inferno and ours
//! in theirs.

use std::path::{Path, PathBuf};

use anyhow::Context;

use super::names::{RepoId, check_relative_path, check_revision};

/// Where the cache lives: `HF_HUB_CACHE`, else `HF_HOME/hub`, else
/// `XDG_CACHE_HOME/huggingface/hub`, else `~/.cache/huggingface/hub` (huggingface_hub's order).
pub fn default_root() -> PathBuf {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(p) = var("HF_HUB_CACHE") {
        return p;
    }
    if let Some(p) = var("HF_HOME") {
        return p.join("hub");
    }
    if let Some(p) = var("XDG_CACHE_HOME") {
        return p.join("huggingface").join("hub");
    }
    let home = var("HOME").unwrap_or_else(|| PathBuf::from("."));
    home.join(".cache").join("huggingface").join("hub")
}

/// A cache root.
#[derive(Debug, Clone)]
pub struct Cache {
    root: PathBuf,
}

impl Cache {
    pub fn new(root: impl Into<PathBuf>) -> Cache {
        Cache { root: root.into() }
    }

    pub fn from_env() -> Cache {
        Cache::new(default_root())
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn repo(&self, id: &RepoId) -> RepoCache {
        RepoCache { id: id.clone(), dir: self.root.join(id.folder_name()) }
    }

    /// Every model repository folder in the cache, whatever tool wrote it.
    pub fn repos(&self) -> std::io::Result<Vec<RepoCache>> {
        let mut out = Vec::new();
        let entries = match std::fs::read_dir(&self.root) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(e),
        };
        for entry in entries {
            let entry = entry?;
            let name = entry.file_name();
            let Some(id) = name.to_str().and_then(RepoId::from_folder_name) else { continue };
            if entry.path().is_dir() {
                out.push(RepoCache { id, dir: entry.path() });
            }
        }
        out.sort_by_key(|a| a.id.as_str().to_lowercase());
        Ok(out)
    }
}

/// One repository's folder in the cache.
#[derive(Debug, Clone)]
pub struct RepoCache {
    pub id: RepoId,
    pub dir: PathBuf,
}

impl RepoCache {
    pub fn blobs_dir(&self) -> PathBuf {
        self.dir.join("blobs")
    }

    pub fn blob_path(&self, etag: &str) -> PathBuf {
        self.blobs_dir().join(etag)
    }

    pub fn incomplete_path(&self, etag: &str) -> PathBuf {
        self.blobs_dir().join(format!("{etag}.incomplete"))
    }

    pub fn snapshot_dir(&self, commit: &str) -> PathBuf {
        self.dir.join("snapshots").join(commit)
    }

    /// The commit a revision points to, from `refs/<revision>`; a commit hash is itself.
    pub fn resolve_ref(&self, revision: &str) -> anyhow::Result<Option<String>> {
        check_revision(revision)?;
        if super::names::is_commit_hash(revision) {
            return Ok(Some(revision.to_string()));
        }
        let path = self.dir.join("refs").join(revision);
        match std::fs::read_to_string(&path) {
            Ok(s) => Ok(Some(s.trim().to_string()).filter(|s| !s.is_empty())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
        }
    }

    /// Records that `revision` resolved to `commit` (not for commit hashes themselves).
    pub fn write_ref(&self, revision: &str, commit: &str) -> anyhow::Result<()> {
        check_revision(revision)?;
        if revision == commit {
            return Ok(());
        }
        let path = self.dir.join("refs").join(revision);
        write_atomic(&path, commit.as_bytes())
    }

    /// The commits that have a snapshot folder, newest first by modification time.
    pub fn snapshots(&self) -> std::io::Result<Vec<String>> {
        let dir = self.dir.join("snapshots");
        let mut found: Vec<(Option<std::time::SystemTime>, String)> = Vec::new();
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        for entry in entries {
            let entry = entry?;
            if let Some(name) = entry.file_name().to_str() {
                let mtime = entry.metadata().and_then(|m| m.modified()).ok();
                found.push((mtime, name.to_string()));
            }
        }
        found.sort_by(|a, b| b.cmp(a));
        Ok(found.into_iter().map(|(_, n)| n).collect())
    }

    /// Links `snapshots/<commit>/<file>` to `blobs/<etag>` with a relative symlink, as
    /// huggingface_hub does, replacing whatever was there.
    pub fn link_snapshot_file(
        &self,
        commit: &str,
        file: &str,
        etag: &str,
    ) -> anyhow::Result<PathBuf> {
        check_relative_path(file)?;
        let link = self.snapshot_dir(commit).join(file);
        let parent = link.parent().context("snapshot path has no parent")?;
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
        let depth = file.split('/').count() + 1; // up to the repo folder: <file dirs…>, <commit>, snapshots
        let mut target = PathBuf::new();
        for _ in 0..depth {
            target.push("..");
        }
        target.push("blobs");
        target.push(etag);
        let tmp = link.with_file_name(format!(
            ".{}.inferno-link",
            link.file_name().and_then(|n| n.to_str()).unwrap_or("file")
        ));
        let _ = std::fs::remove_file(&tmp);
        make_symlink(&target, &tmp).with_context(|| format!("linking {}", link.display()))?;
        std::fs::rename(&tmp, &link).with_context(|| format!("linking {}", link.display()))?;
        Ok(link)
    }
}

#[cfg(unix)]
fn make_symlink(target: &Path, link: &Path) -> std::io::Result<()> {
    std::os::unix::fs::symlink(target, link)
}

#[cfg(not(unix))]
fn make_symlink(target: &Path, link: &Path) -> std::io::Result<()> {
    // Without symlinks, fall back to a copy of the blob (huggingface_hub does the same on Windows).
    let blob = link.parent().map(|p| p.join(target)).unwrap_or_else(|| target.to_path_buf());
    std::fs::copy(blob, link).map(|_| ())
}

/// Writes a small file so that readers see either the old or the new content, never half.
pub fn write_atomic(path: &Path, data: &[u8]) -> anyhow::Result<()> {
    let parent = path.parent().context("path has no parent")?;
    std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    let mut tmp = tempfile::NamedTempFile::new_in(parent)
        .with_context(|| format!("creating a file in {}", parent.display()))?;
    std::io::Write::write_all(&mut tmp, data)?;
    tmp.persist(path).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_links_are_relative_and_resolve() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = Cache::new(tmp.path());
        let repo = cache.repo(&RepoId::parse("org/model").unwrap());
        std::fs::create_dir_all(repo.blobs_dir()).unwrap();
        std::fs::write(repo.blob_path("abc"), b"hello").unwrap();
        let commit = "0123456789abcdef0123456789abcdef01234567";
        let top = repo.link_snapshot_file(commit, "config.json", "abc").unwrap();
        let nested = repo.link_snapshot_file(commit, "original/config.json", "abc").unwrap();
        assert_eq!(std::fs::read(&top).unwrap(), b"hello");
        assert_eq!(std::fs::read(&nested).unwrap(), b"hello");
        assert!(std::fs::read_link(&nested).unwrap().is_relative());
        repo.write_ref("main", commit).unwrap();
        assert_eq!(repo.resolve_ref("main").unwrap().as_deref(), Some(commit));
        assert_eq!(repo.snapshots().unwrap(), vec![commit.to_string()]);
        assert_eq!(cache.repos().unwrap().len(), 1);
    }

    #[test]
    fn root_from_env_order() {
        // Only checks the pure joining rules; the env is process-global so do not mutate it here.
        let root = default_root();
        assert!(root.ends_with("hub") || std::env::var_os("HF_HUB_CACHE").is_some());
    }
}
