//! Where `play` keeps its state: the line history and saved conversations, under
//! `$XDG_STATE_HOME/inferno/` (else `~/.local/state/inferno/`). A conversation is
//! `conversations/NAME.json`, written to a temporary file and renamed over the old one, so a
//! crash or a full disk never leaves half a file under a name.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use crate::chat::SavedChat;
use crate::error::{ErrorKind, fail};

/// The name the conversation is saved under when play exits.
pub const LAST: &str = "last";

/// `$XDG_STATE_HOME/inferno`, else `~/.local/state/inferno` (not created).
pub fn state_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_STATE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state")))?;
    Some(base.join("inferno"))
}

fn conversations_dir() -> anyhow::Result<PathBuf> {
    state_dir().map(|d| d.join("conversations")).ok_or_else(|| {
        fail(ErrorKind::Storage, "no place for conversations: set XDG_STATE_HOME or HOME")
    })
}

/// A name is one plain file name: no path separators, no `..`, no leading dot (hidden and
/// temporary files), no control characters, so `/save ../../x` cannot write outside the folder.
pub fn check_name(name: &str) -> anyhow::Result<()> {
    let why = if name.is_empty() {
        Some("it is empty")
    } else if name.contains(['/', '\\']) {
        Some("it contains a path separator")
    } else if name.contains("..") || name.starts_with('.') {
        Some("it starts with a dot or contains \"..\"")
    } else if name.chars().any(char::is_control) {
        Some("it contains a control character")
    } else if name.len() > 200 {
        Some("it is longer than 200 bytes")
    } else {
        None
    };
    match why {
        Some(why) => Err(fail(
            ErrorKind::InvalidInput,
            format!("{name:?} is not a conversation name: {why}"),
        )),
        None => Ok(()),
    }
}

fn path_of(dir: &Path, name: &str) -> anyhow::Result<PathBuf> {
    check_name(name)?;
    Ok(dir.join(format!("{name}.json")))
}

/// Writes `chat` as `name`, replacing an earlier one; returns the file's path.
pub fn save(name: &str, chat: &SavedChat) -> anyhow::Result<PathBuf> {
    let dir = conversations_dir()?;
    let path = path_of(&dir, name)?;
    let storage = |e: std::io::Error| fail(ErrorKind::Storage, format!("saving {name}: {e}"));
    std::fs::create_dir_all(&dir).map_err(storage)?;
    let tmp = dir.join(format!(".{name}.json.{}.tmp", std::process::id()));
    let written =
        write_synced(&tmp, chat.to_json().as_bytes()).and_then(|()| std::fs::rename(&tmp, &path));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(storage(e));
    }
    Ok(path)
}

fn write_synced(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut f = std::fs::File::create(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}

/// Reads conversation `name`: not there is NotFound, anything wrong with the file is one
/// InvalidInput line naming it.
pub fn load(name: &str) -> anyhow::Result<SavedChat> {
    let path = path_of(&conversations_dir()?, name)?;
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(fail(
                ErrorKind::NotFound,
                format!("no saved conversation {name:?} (/list shows them)"),
            ));
        }
        Err(e) => {
            return Err(fail(ErrorKind::InvalidInput, format!("{}: {e}", path.display())));
        }
    };
    SavedChat::parse(&text)
        .map_err(|e| fail(ErrorKind::InvalidInput, format!("{}: {e}", path.display())))
}

/// The saved conversations' names, the most recent first.
pub fn list() -> anyhow::Result<Vec<String>> {
    let dir = conversations_dir()?;
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(fail(ErrorKind::Storage, format!("{}: {e}", dir.display()))),
    };
    let mut found: Vec<(SystemTime, String)> = entries
        .flatten()
        .filter_map(|e| {
            let file = e.file_name().into_string().ok()?;
            let name = file.strip_suffix(".json").filter(|n| check_name(n).is_ok())?;
            let modified = e.metadata().and_then(|m| m.modified()).ok()?;
            Some((modified, name.to_string()))
        })
        .collect();
    found.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    Ok(found.into_iter().map(|(_, n)| n).collect())
}

#[cfg(test)]
mod tests {
    use super::check_name;

    #[test]
    fn names_are_plain_file_names() {
        for ok in ["last", "my chat", "2025-01-02", "ünïcode", "a.b"] {
            assert!(check_name(ok).is_ok(), "{ok:?}");
        }
        for bad in
            ["", "../x", "a/b", "a\\b", "..", ".", ".hidden", "a..b", "tab\tname", "nl\n", "\0"]
        {
            let err = check_name(bad).unwrap_err();
            assert_eq!(crate::error::kind_of(&err), crate::error::ErrorKind::InvalidInput);
            assert_eq!(err.to_string().lines().count(), 1, "{err}");
        }
        assert!(check_name(&"x".repeat(201)).is_err());
    }
}
