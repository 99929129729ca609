//! `inferno download REPO`: fetch a model into the Hugging Face cache and print its snapshot
//! directory on stdout (so `$(inferno download …)` works). Progress and notes go to stderr.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::Context;

use crate::cli::DownloadArgs;
use crate::error::{ErrorKind, fail};
use crate::hub::api::{HubClient, HubConfig, RepoInfo, Transient};
use crate::hub::fetch::{self, Checksum, FileSpec, Outcome};
use crate::hub::progress::Progress;
use crate::hub::select::{self, Filters, Listed, SAFETENSORS_INDEX};
use crate::hub::{Cache, RepoCache, RepoId, names};
use crate::util::human_bytes;

/// Files fetched at the same time.
const PARALLEL_FILES: usize = 4;

pub fn run(args: DownloadArgs) -> anyhow::Result<()> {
    let repo_id = RepoId::parse(&args.repo)?;
    names::check_revision(&args.revision)?;
    let cache = Cache::from_env();
    let repo = cache.repo(&repo_id);
    let config = HubConfig::from_env();
    let filters = Filters { include: args.include.clone(), exclude: args.exclude.clone() };
    if config.offline {
        return offline(&repo, &args.revision, &filters, args.dry_run);
    }
    let client = HubClient::new(config);
    let info = retry_transient(|| client.repo_info(&repo_id, &args.revision))?;
    let specs = plan(&client, &repo_id, &info, &filters)?;
    if args.dry_run {
        print_dry_run(&repo, &specs);
        return Ok(());
    }
    download_all(&client, &cache, &repo, &info.sha, &specs)?;
    repo.write_ref(&args.revision, &info.sha)?;
    println!("{}", repo.snapshot_dir(&info.sha).display());
    Ok(())
}

/// Validates the listing and chooses what to fetch, with each file's size and checksum.
fn plan(
    client: &HubClient,
    repo: &RepoId,
    info: &RepoInfo,
    filters: &Filters,
) -> anyhow::Result<Vec<FileSpec>> {
    let mut listed = Vec::with_capacity(info.siblings.len());
    for s in &info.siblings {
        names::check_relative_path(&s.rfilename)?;
        let size = s.lfs.as_ref().map(|l| l.size).or(s.size).unwrap_or(0);
        listed.push(Listed { path: s.rfilename.clone(), size });
    }
    let shards = if filters.include.is_empty() && listed.iter().any(|f| f.path == SAFETENSORS_INDEX)
    {
        let bytes = retry_transient(|| client.read_small(repo, &info.sha, SAFETENSORS_INDEX))?;
        let shards = select::index_shards(&bytes)?;
        for shard in &shards {
            names::check_relative_path(shard)?;
        }
        Some(shards)
    } else {
        None
    };
    let chosen = select::select(repo.as_str(), &listed, shards.as_ref(), filters)?;
    if chosen.is_empty() {
        return Err(fail(
            ErrorKind::NotFound,
            format!("no files of {repo} match the given filters"),
        ));
    }
    chosen.iter().map(|f| spec_for(info, f)).collect()
}

fn spec_for(info: &RepoInfo, file: &Listed) -> anyhow::Result<FileSpec> {
    let sib = info
        .siblings
        .iter()
        .find(|s| s.rfilename == file.path)
        .context("selected file vanished from the listing")?;
    let (etag, checksum) = match (&sib.lfs, &sib.blob_id) {
        (Some(lfs), _) => {
            (lfs.sha256.to_ascii_lowercase(), Checksum::Sha256(lfs.sha256.to_ascii_lowercase()))
        }
        (None, Some(blob)) => {
            (blob.to_ascii_lowercase(), Checksum::GitSha1(blob.to_ascii_lowercase()))
        }
        (None, None) => {
            return Err(fail(
                ErrorKind::Integrity,
                format!("the Hub listing has no checksum for {}", file.path),
            ));
        }
    };
    if !etag.bytes().all(|b| b.is_ascii_hexdigit()) || !(etag.len() == 40 || etag.len() == 64) {
        return Err(fail(
            ErrorKind::Integrity,
            format!("the Hub listing has an invalid checksum for {}", file.path),
        ));
    }
    Ok(FileSpec { path: file.path.clone(), size: file.size, etag, checksum })
}

fn print_dry_run(repo: &RepoCache, specs: &[FileSpec]) {
    let width = specs.iter().map(|s| s.path.len()).max().unwrap_or(0);
    let mut total = 0;
    let mut to_fetch = 0;
    for s in specs {
        let cached = fetch::is_cached(repo, s);
        total += s.size;
        if !cached {
            to_fetch += s.size;
        }
        let note = if cached { "  (cached)" } else { "" };
        println!("{:<width$}  {:>10}{note}", s.path, human_bytes(s.size));
    }
    println!(
        "{} files, {} in total, {} to download",
        specs.len(),
        human_bytes(total),
        human_bytes(to_fetch)
    );
}

/// Downloads small files first, then the weights, several at a time.
fn download_all(
    client: &HubClient,
    cache: &Cache,
    repo: &RepoCache,
    commit: &str,
    specs: &[FileSpec],
) -> anyhow::Result<()> {
    let mut order: Vec<&FileSpec> = specs.iter().collect();
    order.sort_by_key(|s| s.size);
    let total: u64 = specs.iter().map(|s| s.size).sum();
    let already: u64 = specs.iter().filter(|s| fetch::is_cached(repo, s)).map(|s| s.size).sum();
    let progress = Progress::new(total, already);
    let next = AtomicUsize::new(0);
    let first_error: Mutex<Option<anyhow::Error>> = Mutex::new(None);
    std::thread::scope(|scope| {
        for _ in 0..PARALLEL_FILES.min(order.len()) {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    let Some(spec) = order.get(i) else { break };
                    if first_error.lock().map(|e| e.is_some()).unwrap_or(true) {
                        break;
                    }
                    let mut bar = progress.file(&spec.path, spec.size);
                    match fetch::fetch(client, cache, repo, commit, spec, &mut bar) {
                        Ok(Outcome::Downloaded) => bar.done("downloaded"),
                        Ok(Outcome::AlreadyCached) => bar.done("cached"),
                        Err(e) => {
                            if let Ok(mut slot) = first_error.lock() {
                                slot.get_or_insert(e.context(format!("downloading {}", spec.path)));
                            }
                            break;
                        }
                    }
                }
            });
        }
    });
    progress.finish();
    match first_error.into_inner() {
        Ok(Some(err)) => Err(err),
        Ok(None) => Ok(()),
        Err(_) => Err(anyhow::anyhow!("a download thread panicked")),
    }
}

/// Repeats a request that failed transiently (the listing, the index) a few times.
fn retry_transient<T>(mut f: impl FnMut() -> anyhow::Result<T>) -> anyhow::Result<T> {
    let mut attempt = 0;
    loop {
        match f() {
            Err(e) if e.downcast_ref::<Transient>().is_some() => {
                attempt += 1;
                if attempt >= 3 {
                    let hint =
                        "check your connection, or set HF_HUB_OFFLINE=1 to use what is cached";
                    return Err(fail(ErrorKind::Network, format!("{e}; {hint}")));
                }
                std::thread::sleep(std::time::Duration::from_millis(500 * attempt));
            }
            other => return other,
        }
    }
}

/// `HF_HUB_OFFLINE=1`: no network; succeed only if the cache already has the files.
fn offline(
    repo: &RepoCache,
    revision: &str,
    filters: &Filters,
    dry_run: bool,
) -> anyhow::Result<()> {
    let not_cached = || {
        fail(
            ErrorKind::NotFound,
            format!(
                "offline mode (HF_HUB_OFFLINE is set) and {}@{revision} is not in the cache",
                repo.id
            ),
        )
    };
    let commit = repo.resolve_ref(revision)?.ok_or_else(not_cached)?;
    let dir = repo.snapshot_dir(&commit);
    if !dir.is_dir() {
        return Err(not_cached());
    }
    let listed = snapshot_listing(&dir)?;
    let shards = match std::fs::read(dir.join(SAFETENSORS_INDEX)) {
        Ok(bytes) if filters.include.is_empty() => Some(select::index_shards(&bytes)?),
        _ => None,
    };
    let chosen = select::select(repo.id.as_str(), &listed, shards.as_ref(), filters)
        .map_err(|_| not_cached())?;
    for f in &chosen {
        if std::fs::metadata(dir.join(&f.path)).is_err() {
            return Err(not_cached());
        }
    }
    if dry_run {
        for f in &chosen {
            println!("{}  {}  (cached)", f.path, human_bytes(f.size));
        }
        println!("{} files, all cached (offline)", chosen.len());
    } else {
        println!("{}", dir.display());
    }
    Ok(())
}

/// The files of a snapshot folder as a listing (dangling links get size 0 and fail later).
fn snapshot_listing(dir: &std::path::Path) -> anyhow::Result<Vec<Listed>> {
    fn walk(
        base: &std::path::Path,
        dir: &std::path::Path,
        out: &mut Vec<Listed>,
    ) -> std::io::Result<()> {
        for entry in std::fs::read_dir(dir)? {
            let path = entry?.path();
            if path.is_dir() {
                walk(base, &path, out)?;
            } else if let Ok(rel) = path.strip_prefix(base) {
                let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
                out.push(Listed { path: rel.to_string_lossy().replace('\\', "/"), size });
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out).with_context(|| format!("reading {}", dir.display()))?;
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}
