//! From what a user types to the files of a model: a local path, or a repo id in the cache.
//!
//! Every command that takes a model (`play`, `bench`, …) goes through [`resolve_model`], so a
//! model can be named the same way everywhere: `org/name`, `org/name@revision` (branch, tag,
//! full or short commit), or a path to a local directory or `.gguf` file.

use std::path::{Path, PathBuf};

use super::names::is_commit_hash;
use super::{Cache, RepoCache, RepoId};
use crate::error::{ErrorKind, fail};

/// Where a model's files are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedModel {
    /// A directory (snapshot or local folder) or a `.gguf` file.
    pub path: PathBuf,
    /// The repo, when the model came from the cache.
    pub repo: Option<RepoId>,
    /// The snapshot's commit, when the model came from the cache.
    pub commit: Option<String>,
}

/// Resolves `name`: a local path is used as is; anything else is `org/name[@revision]` looked
/// up in `cache` (revision `main` by default; without a `refs/main`, the newest snapshot).
pub fn resolve_model(name: &str, cache: &Cache) -> anyhow::Result<ResolvedModel> {
    if looks_like_path(name) {
        return local(&expand_home(name));
    }
    let candidate = Path::new(name);
    if candidate.is_dir() || (candidate.is_file() && is_gguf(candidate)) {
        return local(candidate);
    }
    let (id, revision) = match name.split_once('@') {
        Some((id, rev)) => (id, Some(rev)),
        None => (name, None),
    };
    let repo = cache.repo(&RepoId::parse(id)?);
    let commit = match revision {
        Some(rev) => find_revision(&repo, rev)?,
        None => find_default(&repo)?,
    };
    let Some(commit) = commit else {
        return Err(not_downloaded(id, revision));
    };
    Ok(ResolvedModel {
        path: repo.snapshot_dir(&commit),
        repo: Some(repo.id),
        commit: Some(commit),
    })
}

/// Names that can only be paths: absolute, `./`, `../`, `~`.
fn looks_like_path(name: &str) -> bool {
    name.starts_with('/')
        || name.starts_with("./")
        || name.starts_with("../")
        || name.starts_with('~')
        || name == "."
        || name == ".."
}

fn expand_home(name: &str) -> PathBuf {
    let home = std::env::var_os("HOME").filter(|h| !h.is_empty());
    match (name.strip_prefix('~'), home) {
        (Some(rest), Some(home)) if rest.is_empty() || rest.starts_with('/') => {
            PathBuf::from(home).join(rest.trim_start_matches('/'))
        }
        _ => PathBuf::from(name),
    }
}

fn local(path: &Path) -> anyhow::Result<ResolvedModel> {
    let meta = std::fs::metadata(path)
        .map_err(|e| fail(ErrorKind::NotFound, format!("no model at {}: {e}", path.display())))?;
    if meta.is_file() && !is_gguf(path) {
        return Err(fail(
            ErrorKind::InvalidInput,
            format!("{} is not a model: expected a directory or a .gguf file", path.display()),
        ));
    }
    Ok(ResolvedModel { path: path.to_path_buf(), repo: None, commit: None })
}

fn is_gguf(path: &Path) -> bool {
    path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
}

/// `refs/main`, else the newest snapshot (a cache filled by a tool that wrote no refs).
fn find_default(repo: &RepoCache) -> anyhow::Result<Option<String>> {
    if let Some(commit) = repo.resolve_ref("main")?
        && repo.snapshot_dir(&commit).is_dir()
    {
        return Ok(Some(commit));
    }
    Ok(repo.snapshots().unwrap_or_default().into_iter().find(|c| repo.snapshot_dir(c).is_dir()))
}

/// A branch/tag from `refs/`, a full commit, or a unique prefix of a cached commit (as
/// `inferno list` shows them).
fn find_revision(repo: &RepoCache, rev: &str) -> anyhow::Result<Option<String>> {
    if let Some(commit) = repo.resolve_ref(rev)? {
        return Ok(Some(commit).filter(|c| repo.snapshot_dir(c).is_dir()));
    }
    let is_short_hash =
        rev.len() >= 4 && !is_commit_hash(rev) && rev.bytes().all(|b| b.is_ascii_hexdigit());
    if !is_short_hash {
        return Ok(None);
    }
    let rev = rev.to_ascii_lowercase();
    let matches: Vec<String> =
        repo.snapshots().unwrap_or_default().into_iter().filter(|c| c.starts_with(&rev)).collect();
    match matches.len() {
        0 => Ok(None),
        1 => Ok(matches.into_iter().next()),
        n => Err(fail(
            ErrorKind::InvalidInput,
            format!("revision {rev} of {} is ambiguous: {n} cached commits start with it", repo.id),
        )),
    }
}

fn not_downloaded(id: &str, revision: Option<&str>) -> anyhow::Error {
    let message = match revision {
        None => format!("model {id} is not downloaded: run `inferno download {id}`"),
        Some(rev) => format!(
            "model {id} at revision {rev} is not downloaded: run `inferno download {id} --revision {rev}`"
        ),
    };
    fail(ErrorKind::NotFound, message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::kind_of;

    const OLD: &str = "1111111111111111111111111111111111111111";
    const NEW: &str = "abcdef0123456789abcdef0123456789abcdef01";

    /// A cache with `org/model` at two commits, `main` pointing at the older one.
    fn cache_with_two_snapshots() -> (tempfile::TempDir, Cache) {
        let tmp = tempfile::tempdir().unwrap();
        let cache = Cache::new(tmp.path().join("hub"));
        let repo = cache.repo(&RepoId::parse("org/model").unwrap());
        std::fs::create_dir_all(repo.blobs_dir()).unwrap();
        std::fs::write(repo.blob_path("cfg"), "{}").unwrap();
        for commit in [OLD, NEW] {
            repo.link_snapshot_file(commit, "config.json", "cfg").unwrap();
        }
        repo.write_ref("main", OLD).unwrap();
        repo.write_ref("dev", NEW).unwrap();
        (tmp, cache)
    }

    fn commit_of(name: &str, cache: &Cache) -> Option<String> {
        resolve_model(name, cache).unwrap().commit
    }

    #[test]
    fn repo_ids_resolve_through_refs() {
        let (_tmp, cache) = cache_with_two_snapshots();
        let r = resolve_model("org/model", &cache).unwrap();
        let repo = cache.repo(&RepoId::parse("org/model").unwrap());
        assert_eq!(
            r,
            ResolvedModel {
                path: repo.snapshot_dir(OLD),
                repo: Some(RepoId::parse("org/model").unwrap()),
                commit: Some(OLD.into()),
            }
        );
        assert_eq!(commit_of("org/model@main", &cache).as_deref(), Some(OLD));
        assert_eq!(commit_of("org/model@dev", &cache).as_deref(), Some(NEW));
        assert_eq!(commit_of(&format!("org/model@{NEW}"), &cache).as_deref(), Some(NEW));
        assert_eq!(
            commit_of("org/model@abcdef0", &cache).as_deref(),
            Some(NEW),
            "short commit as `list` shows"
        );
    }

    #[test]
    fn without_refs_the_newest_snapshot_wins() {
        let (_tmp, cache) = cache_with_two_snapshots();
        let repo = cache.repo(&RepoId::parse("org/model").unwrap());
        std::fs::remove_dir_all(repo.dir.join("refs")).unwrap();
        let old = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
        std::fs::File::open(repo.snapshot_dir(OLD)).unwrap().set_modified(old).unwrap();
        assert_eq!(commit_of("org/model", &cache).as_deref(), Some(NEW));
    }

    #[test]
    fn missing_models_say_how_to_download() {
        let (_tmp, cache) = cache_with_two_snapshots();
        let err = resolve_model("org/other", &cache).unwrap_err();
        assert_eq!(kind_of(&err), ErrorKind::NotFound);
        assert_eq!(
            err.to_string(),
            "model org/other is not downloaded: run `inferno download org/other`"
        );
        let err = resolve_model("org/model@v2", &cache).unwrap_err();
        assert_eq!(kind_of(&err), ErrorKind::NotFound);
        assert!(err.to_string().contains("inferno download org/model --revision v2"), "{err}");
        let err = resolve_model(&format!("org/model@{}", "2".repeat(40)), &cache).unwrap_err();
        assert_eq!(kind_of(&err), ErrorKind::NotFound);
    }

    #[test]
    fn ref_to_a_missing_snapshot_is_not_downloaded() {
        let (_tmp, cache) = cache_with_two_snapshots();
        let repo = cache.repo(&RepoId::parse("org/model").unwrap());
        std::fs::remove_dir_all(repo.snapshot_dir(NEW)).unwrap();
        assert_eq!(
            kind_of(&resolve_model("org/model@dev", &cache).unwrap_err()),
            ErrorKind::NotFound
        );
        assert_eq!(commit_of("org/model", &cache).as_deref(), Some(OLD));
    }

    #[test]
    fn bad_names_are_invalid_input() {
        let (_tmp, cache) = cache_with_two_snapshots();
        for bad in ["org/model@../../etc", "a/b/c", "org/mo del", "org/model@"] {
            let err = resolve_model(bad, &cache).unwrap_err();
            assert_eq!(kind_of(&err), ErrorKind::InvalidInput, "{bad}: {err}");
        }
    }

    #[test]
    fn local_paths_are_used_as_is() {
        let (tmp, cache) = cache_with_two_snapshots();
        let dir = tmp.path().join("my-model");
        std::fs::create_dir(&dir).unwrap();
        let gguf = tmp.path().join("m.gguf");
        std::fs::write(&gguf, b"GGUF").unwrap();
        for path in [&dir, &gguf] {
            let r = resolve_model(path.to_str().unwrap(), &cache).unwrap();
            assert_eq!(r, ResolvedModel { path: path.clone(), repo: None, commit: None });
        }
        let missing = tmp.path().join("nope");
        let err = resolve_model(missing.to_str().unwrap(), &cache).unwrap_err();
        assert_eq!(kind_of(&err), ErrorKind::NotFound);
        let txt = tmp.path().join("notes.txt");
        std::fs::write(&txt, "x").unwrap();
        assert_eq!(
            kind_of(&resolve_model(txt.to_str().unwrap(), &cache).unwrap_err()),
            ErrorKind::InvalidInput
        );
        // `./x` is a path even when it does not exist: never looked up as a repo.
        assert_eq!(
            kind_of(&resolve_model("./org/model", &cache).unwrap_err()),
            ErrorKind::NotFound
        );
    }

    #[test]
    fn home_is_expanded() {
        let Some(home) = std::env::var_os("HOME") else { return };
        assert_eq!(expand_home("~/models/x.gguf"), PathBuf::from(&home).join("models/x.gguf"));
        assert_eq!(expand_home("~"), PathBuf::from(&home));
        assert_eq!(expand_home("~other/x"), PathBuf::from("~other/x"));
    }
}
