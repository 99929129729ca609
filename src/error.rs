//! Errors that decide the process exit code.
//!
//! Most failures travel as `anyhow::Error` with context; the few a caller (or a script using
//! inferno) must tell apart carry an [`ErrorKind`] through [`Failure`], and `main` maps that to
//! the documented exit code. Keep the codes stable: they are part of the CLI contract
//! (docs/operations.md, "Exit codes").

use std::fmt;

/// What went wrong, coarse enough for an exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// Anything not classified below.
    Other,
    /// Repository, revision, file or model does not exist (HTTP 404, not in the cache).
    NotFound,
    /// Gated or private repository, or a bad token (HTTP 401/403).
    Unauthorized,
    /// The Hub could not be reached, or kept failing after retries.
    Network,
    /// Downloaded or local data failed verification (size, sha256, corrupt file).
    Integrity,
    /// The disk is full or the cache is not writable.
    Storage,
    /// Not enough GPU (or, with `--cpu`, host) memory: refused by the memory plan before
    /// loading, or an allocation failed.
    Memory,
    /// The user asked for something malformed or unsafe (bad repo id, path traversal).
    InvalidInput,
    /// No usable GPU (or a CUDA library, NCCL included, is missing).
    NoDevice,
    /// Another rank of a tensor-parallel group failed, exited or could not be reached.
    Rank,
}

impl ErrorKind {
    /// The process exit code for this kind (2 is clap's usage error).
    pub fn exit_code(self) -> u8 {
        match self {
            ErrorKind::Other => 1,
            ErrorKind::InvalidInput => 2,
            ErrorKind::NotFound => 3,
            ErrorKind::Unauthorized => 4,
            ErrorKind::Network => 5,
            ErrorKind::Integrity => 6,
            ErrorKind::Storage | ErrorKind::Memory => 7,
            ErrorKind::NoDevice => 8,
            ErrorKind::Rank => 9,
        }
    }
}

/// Ends the process at once with `kind`'s exit code, running no exit handlers: a tensor-parallel
/// rank whose peer died or hangs. CUDA's and NCCL's own handlers would wait for the GPU's work,
/// a collective that never ends (a rank that noticed a stopped peer and called `exit` was
/// still there 45 s later); the driver frees the process's GPU memory when it is gone.
pub fn exit_now(kind: ErrorKind) -> ! {
    // SAFETY: _exit ends the process without touching its state; stderr is unbuffered.
    unsafe { libc::_exit(kind.exit_code().into()) }
}

/// An error with a kind and a one-line message meant for the user.
#[derive(Debug)]
pub struct Failure {
    pub kind: ErrorKind,
    pub message: String,
}

impl Failure {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Failure { kind, message: message.into() }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Failure {}

/// Shorthand: `Err(fail(ErrorKind::NotFound, "…"))?`.
pub fn fail(kind: ErrorKind, message: impl Into<String>) -> anyhow::Error {
    Failure::new(kind, message).into()
}

/// The kind of the first [`Failure`] in an error chain, or of a recognisable I/O error.
pub fn kind_of(err: &anyhow::Error) -> ErrorKind {
    for cause in err.chain() {
        if let Some(f) = cause.downcast_ref::<Failure>() {
            return f.kind;
        }
        if let Some(io) = cause.downcast_ref::<std::io::Error>()
            && is_storage_error(io)
        {
            return ErrorKind::Storage;
        }
    }
    if is_out_of_memory(err) {
        return ErrorKind::Memory;
    }
    ErrorKind::Other
}

/// The outermost message plus the innermost cause when it adds something, on one line
/// (library errors can carry backtraces or multi-line text: only their first line is kept).
pub fn one_line(err: &anyhow::Error) -> String {
    let first = |s: String| s.lines().next().unwrap_or("").trim().to_string();
    let top = first(err.to_string());
    let root = first(err.root_cause().to_string());
    if root == top || top.contains(&root) { top } else { format!("{top}: {root}") }
}

/// A device allocation that failed: candle passes the driver's error on as text inside its
/// own error type, so the code name is what can be recognised.
pub fn is_out_of_memory(err: &anyhow::Error) -> bool {
    err.chain().any(|c| c.to_string().contains("CUDA_ERROR_OUT_OF_MEMORY"))
}

/// Disk full, quota exceeded, a file-size limit (EFBIG: `ulimit -f`, or the filesystem's
/// largest file) or a read-only cache: the user must free space or pick another root.
pub fn is_storage_error(err: &std::io::Error) -> bool {
    use std::io::ErrorKind as K;
    matches!(
        err.kind(),
        K::StorageFull
            | K::QuotaExceeded
            | K::FileTooLarge
            | K::ReadOnlyFilesystem
            | K::PermissionDenied
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kind_survives_context() {
        let err = fail(ErrorKind::Unauthorized, "gated").context("downloading x");
        assert_eq!(kind_of(&err), ErrorKind::Unauthorized);
        assert_eq!(kind_of(&err).exit_code(), 4);
    }

    #[test]
    fn device_out_of_memory_is_memory() {
        // The text candle gives a failed cuMemAllocAsync, under our context.
        let candle = candle_core::Error::Msg(
            "DriverError(CUDA_ERROR_OUT_OF_MEMORY, \"out of memory\")".into(),
        );
        let err = anyhow::Error::from(candle).context("loading weights");
        assert_eq!(kind_of(&err), ErrorKind::Memory);
        assert_eq!(kind_of(&err).exit_code(), 7);
        assert_eq!(kind_of(&anyhow::anyhow!("CUDA_ERROR_INVALID_VALUE")), ErrorKind::Other);
    }

    #[test]
    fn disk_full_is_storage() {
        let io = std::io::Error::from(std::io::ErrorKind::StorageFull);
        let err = anyhow::Error::from(io).context("writing blob");
        assert_eq!(kind_of(&err), ErrorKind::Storage);
    }
}
