//! Fetching one file into the cache: resumable, retried, verified, and never visible half-written.
//!
//! Bytes go to `blobs/<etag>.incomplete` (huggingface_hub's name, so either tool can resume the
//! other's partial file). An interrupted download continues with an HTTP Range request. Only
//! after the size and the checksum (LFS sha256, or the git blob sha1 for small files) match is
//! the file renamed to `blobs/<etag>` and linked from the snapshot. A lock file under
//! `.locks/` (the same one huggingface_hub takes) keeps two processes off the same blob.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use sha1::Sha1;
use sha2::{Digest, Sha256};

use super::api::{HubClient, Transient};
use super::cache::{Cache, RepoCache};
use super::progress::FileProgress;
use crate::error::{ErrorKind, fail};

/// How many times a transient failure is retried (each retry resumes where the last stopped).
const MAX_RETRIES: u32 = 5;

/// What a file must be, from the repo listing.
#[derive(Debug, Clone)]
pub struct FileSpec {
    pub path: String,
    pub size: u64,
    /// The blob name: the LFS sha256, or the git blob sha1 for non-LFS files.
    pub etag: String,
    pub checksum: Checksum,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Checksum {
    Sha256(String),
    GitSha1(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    AlreadyCached,
    Downloaded,
}

/// True when the blob is already complete in the cache.
pub fn is_cached(repo: &RepoCache, spec: &FileSpec) -> bool {
    std::fs::metadata(repo.blob_path(&spec.etag)).is_ok_and(|m| m.is_file() && m.len() == spec.size)
}

/// Makes `snapshots/<commit>/<spec.path>` point at a verified blob, downloading it if needed.
pub fn fetch(
    client: &HubClient,
    cache: &Cache,
    repo: &RepoCache,
    commit: &str,
    spec: &FileSpec,
    progress: &mut FileProgress,
) -> anyhow::Result<Outcome> {
    if is_cached(repo, spec) {
        repo.link_snapshot_file(commit, &spec.path, &spec.etag)?;
        return Ok(Outcome::AlreadyCached);
    }
    let blobs = repo.blobs_dir();
    std::fs::create_dir_all(&blobs).with_context(|| format!("creating {}", blobs.display()))?;
    let _lock = lock_blob(cache, repo, &spec.etag)?;
    if is_cached(repo, spec) {
        // Another process finished it while we waited for the lock.
        repo.link_snapshot_file(commit, &spec.path, &spec.etag)?;
        return Ok(Outcome::AlreadyCached);
    }

    let partial = repo.incomplete_path(&spec.etag);
    let mut attempt = 0;
    loop {
        match download_into(client, repo, commit, spec, &partial, progress) {
            Ok(()) => break,
            Err(err) if err.downcast_ref::<Transient>().is_some() => {
                attempt += 1;
                if attempt > MAX_RETRIES {
                    return Err(fail(
                        ErrorKind::Network,
                        format!(
                            "downloading {} failed after {MAX_RETRIES} retries: {err}",
                            spec.path
                        ),
                    ));
                }
                progress.message(&format!("retry {attempt}/{MAX_RETRIES}: {err}"));
                std::thread::sleep(backoff(attempt));
            }
            Err(err) => return Err(err),
        }
    }

    progress.message("verifying");
    if let Err(err) = verify(&partial, spec) {
        let _ = std::fs::remove_file(&partial);
        return Err(err);
    }
    let blob = repo.blob_path(&spec.etag);
    std::fs::rename(&partial, &blob)
        .with_context(|| format!("moving {} into place", blob.display()))?;
    repo.link_snapshot_file(commit, &spec.path, &spec.etag)?;
    Ok(Outcome::Downloaded)
}

/// 0.5 s, 1 s, 2 s … capped at 8 s; `INFERNO_RETRY_DELAY_MS` overrides the base (tests).
fn backoff(attempt: u32) -> Duration {
    let base = crate::switches::retry_delay_ms();
    Duration::from_millis((base << (attempt - 1).min(4)).min(8_000))
}

/// Appends the missing bytes of the file to `partial`, resuming from its current length.
fn download_into(
    client: &HubClient,
    repo: &RepoCache,
    commit: &str,
    spec: &FileSpec,
    partial: &Path,
    progress: &mut FileProgress,
) -> anyhow::Result<()> {
    let mut file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(partial)
        .with_context(|| format!("opening {}", partial.display()))?;
    let mut have = file.metadata()?.len();
    if have > spec.size {
        file.set_len(0)?;
        have = 0;
    }
    progress.set_position(have);
    if have == spec.size {
        return Ok(());
    }
    let stream = client.open_file(&repo.id, commit, &spec.path, have)?;
    if stream.start != have {
        // The server ignored the Range request: start over.
        file.set_len(0)?;
        have = 0;
        progress.set_position(0);
    }
    file.seek(SeekFrom::Start(have))?;
    let mut reader = stream.reader.take(spec.size - have + 1);
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                file.flush()?;
                return Err(Transient(format!("connection lost: {e}")).into());
            }
        };
        have += n as u64;
        if have > spec.size {
            return Err(fail(
                ErrorKind::Integrity,
                format!("{} is larger than the listed {} bytes", spec.path, spec.size),
            ));
        }
        file.write_all(&buf[..n]).with_context(|| format!("writing {}", partial.display()))?;
        progress.inc(n as u64);
    }
    file.sync_all().with_context(|| format!("writing {}", partial.display()))?;
    if have < spec.size {
        return Err(
            Transient(format!("connection closed after {have} of {} bytes", spec.size)).into()
        );
    }
    Ok(())
}

/// Checks size and checksum of a downloaded file against the listing.
pub fn verify(path: &Path, spec: &FileSpec) -> anyhow::Result<()> {
    let len = std::fs::metadata(path)?.len();
    if len != spec.size {
        return Err(fail(
            ErrorKind::Integrity,
            format!("{}: size {len} does not match the listed {} bytes", spec.path, spec.size),
        ));
    }
    let got = checksum_of(path, &spec.checksum, len)?;
    let want = match &spec.checksum {
        Checksum::Sha256(h) | Checksum::GitSha1(h) => h.to_ascii_lowercase(),
    };
    if got != want {
        return Err(fail(
            ErrorKind::Integrity,
            format!(
                "checksum mismatch for {} (expected {want}, got {got}); the bad download was removed, run again",
                spec.path
            ),
        ));
    }
    Ok(())
}

fn checksum_of(path: &Path, kind: &Checksum, len: u64) -> anyhow::Result<String> {
    let mut file = File::open(path)?;
    let mut buf = vec![0u8; 1 << 20];
    let mut feed = |update: &mut dyn FnMut(&[u8])| -> std::io::Result<()> {
        loop {
            let n = file.read(&mut buf)?;
            if n == 0 {
                return Ok(());
            }
            update(&buf[..n]);
        }
    };
    Ok(match kind {
        Checksum::Sha256(_) => {
            let mut h = Sha256::new();
            feed(&mut |b| h.update(b))?;
            hex::encode(h.finalize())
        }
        Checksum::GitSha1(_) => {
            let mut h = Sha1::new();
            h.update(format!("blob {len}\0").as_bytes());
            feed(&mut |b| h.update(b))?;
            hex::encode(h.finalize())
        }
    })
}

/// Takes `<root>/.locks/models--org--name/<etag>.lock`, waiting for another downloader.
fn lock_blob(cache: &Cache, repo: &RepoCache, etag: &str) -> anyhow::Result<File> {
    let dir = cache.root().join(".locks").join(repo.id.folder_name());
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join(format!("{etag}.lock"));
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    if file.try_lock().is_err() {
        eprintln!("waiting for another download of the same file ({})", path.display());
        file.lock().with_context(|| format!("locking {}", path.display()))?;
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn git_blob_sha1_matches_git() {
        // `printf 'hello\n' | git hash-object --stdin`
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("f");
        std::fs::write(&p, b"hello\n").unwrap();
        let spec = FileSpec {
            path: "f".into(),
            size: 6,
            etag: "x".into(),
            checksum: Checksum::GitSha1("ce013625030ba8dba906f756967f9e9ca394464a".into()),
        };
        verify(&p, &spec).unwrap();
        let bad = FileSpec { checksum: Checksum::Sha256("00".repeat(32)), ..spec };
        let err = verify(&p, &bad).unwrap_err();
        assert_eq!(crate::error::kind_of(&err), ErrorKind::Integrity);
    }
}
