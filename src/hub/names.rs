//! Validation of names that come from users or from the Hub before they touch the file system.
//!
//! A repo id becomes a directory name (`models--org--name`) and a sibling file name becomes a
//! path under `snapshots/<commit>/`; either could escape the cache if taken as is.

use crate::error::{ErrorKind, fail};

/// A validated Hub model id: `name` or `org/name`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RepoId(String);

impl RepoId {
    /// Accepts `name` or `org/name` made of ASCII letters, digits, `-`, `_`, `.`; no `..`, no
    /// `--` (the cache uses it as separator), no leading/trailing separators.
    pub fn parse(id: &str) -> anyhow::Result<RepoId> {
        let invalid =
            |why: &str| fail(ErrorKind::InvalidInput, format!("invalid repo id {id:?}: {why}"));
        let parts: Vec<&str> = id.split('/').collect();
        if parts.is_empty() || parts.len() > 2 {
            return Err(invalid("expected `name` or `org/name`"));
        }
        for part in &parts {
            if part.is_empty() || part.len() > 96 {
                return Err(invalid("empty or overlong component"));
            }
            if !part.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')) {
                return Err(invalid("only letters, digits, '-', '_' and '.' are allowed"));
            }
            if part.contains("..") || part.contains("--") {
                return Err(invalid("'..' and '--' are not allowed"));
            }
            let first = part.chars().next().unwrap_or('.');
            let last = part.chars().last().unwrap_or('.');
            if !first.is_ascii_alphanumeric() || matches!(last, '-' | '.') {
                return Err(invalid(
                    "must start with a letter or digit and not end with '-' or '.'",
                ));
            }
        }
        Ok(RepoId(id.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The cache folder name, `models--org--name`.
    pub fn folder_name(&self) -> String {
        format!("models--{}", self.0.replace('/', "--"))
    }

    /// Inverse of [`RepoId::folder_name`], for folders other tools wrote.
    pub fn from_folder_name(folder: &str) -> Option<RepoId> {
        let rest = folder.strip_prefix("models--")?;
        RepoId::parse(&rest.replacen("--", "/", 1)).ok()
    }
}

impl std::fmt::Display for RepoId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Checks a repo-relative file path (from the Hub listing or `--include`d names): forward
/// slashes only, no absolute paths, no `.`/`..`/empty components, no NUL or control chars.
pub fn check_relative_path(path: &str) -> anyhow::Result<()> {
    let bad =
        |why: &str| fail(ErrorKind::InvalidInput, format!("refusing file name {path:?}: {why}"));
    if path.is_empty() {
        return Err(bad("empty"));
    }
    if path.contains('\\') {
        return Err(bad("backslashes are not allowed"));
    }
    if path.starts_with('/') || path.as_bytes().get(1) == Some(&b':') {
        return Err(bad("absolute paths are not allowed"));
    }
    if path.chars().any(|c| c.is_control()) {
        return Err(bad("control characters are not allowed"));
    }
    if path.split('/').any(|c| c.is_empty() || c == "." || c == "..") {
        return Err(bad("'.', '..' and empty path components are not allowed"));
    }
    Ok(())
}

/// Checks a revision (branch, tag, commit, `refs/pr/N`): it names a file under `refs/`.
pub fn check_revision(rev: &str) -> anyhow::Result<()> {
    check_relative_path(rev)
        .map_err(|_| fail(ErrorKind::InvalidInput, format!("invalid revision {rev:?}")))
}

/// True for a full 40-hex-digit commit hash.
pub fn is_commit_hash(rev: &str) -> bool {
    rev.len() == 40 && rev.bytes().all(|b| b.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repo_ids() {
        for ok in ["gpt2", "openai/gpt-oss-20b", "HuggingFaceTB/SmolLM2-135M-Instruct", "a/b.c_d"] {
            assert!(RepoId::parse(ok).is_ok(), "{ok}");
        }
        for bad in [
            "", "/", "a/", "/a", "a/b/c", "../x", "a/..", "a/.x", "a--b/c", "a\\b", "a/b c", "a/b.",
        ] {
            assert!(RepoId::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn folder_name_round_trip() {
        let id = RepoId::parse("openai/gpt-oss-20b").unwrap();
        assert_eq!(id.folder_name(), "models--openai--gpt-oss-20b");
        assert_eq!(RepoId::from_folder_name("models--openai--gpt-oss-20b"), Some(id));
        assert_eq!(RepoId::from_folder_name("datasets--x--y"), None);
    }

    #[test]
    fn relative_paths() {
        for ok in ["config.json", "original/model.safetensors", "a.b/c-d_e.gguf"] {
            assert!(check_relative_path(ok).is_ok(), "{ok}");
        }
        for bad in ["", "../x", "a/../b", "/etc/passwd", "a\\b", "C:x", "a//b", "./a", "a/", "a\nb"]
        {
            assert!(check_relative_path(bad).is_err(), "{bad:?}");
        }
    }
}
