//! What the server and a render worker say over the worker's stdin and stdout: frames of a
//! little-endian u32 length and that many bytes of JSON. The worker is the same binary, so
//! both ends share these types; the parent is trusted, and a frame is at most
//! [`MAX_FRAME`] bytes either way.

use std::io::{self, Read, Write};

use serde::{Deserialize, Serialize};

use crate::error::{ErrorKind, fail};

/// The largest frame: a conversation within serve's body limit, rendered at its output limit.
const MAX_FRAME: usize = 1 << 30;

/// One render: the template as the model's files hold it, the context the parent built, the
/// time `strftime_now` reads, and how long the parent waits.
#[derive(Debug, Serialize, Deserialize)]
pub struct Request {
    pub source: String,
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
    pub ctx: serde_json::Map<String, serde_json::Value>,
    /// Nanoseconds since the Unix epoch.
    pub now_ns: u128,
    pub time_ms: u64,
}

/// The worker's answer to its start (`Ready`) and to each [`Request`].
#[derive(Debug, Serialize, Deserialize)]
pub enum Reply {
    Ready,
    Rendered(String),
    Failed {
        invalid_input: bool,
        message: String,
    },
    /// The render's answer, after which the worker exits (its memory grew, or a render thread
    /// was left running or panicked).
    Retiring(Box<Reply>),
}

impl Reply {
    /// The render's result as [`super::super::ChatTemplate::render`] returns it.
    pub fn into_result(self) -> anyhow::Result<String> {
        match self {
            Reply::Rendered(s) => Ok(s),
            Reply::Failed { invalid_input, message } => {
                let kind = if invalid_input { ErrorKind::InvalidInput } else { ErrorKind::Other };
                Err(fail(kind, message))
            }
            Reply::Retiring(r) => r.into_result(),
            Reply::Ready => Err(anyhow::anyhow!("the chat template's worker answered out of turn")),
        }
    }

    pub fn from_result(r: anyhow::Result<String>) -> Reply {
        match r {
            Ok(s) => Reply::Rendered(s),
            Err(e) => Reply::Failed {
                invalid_input: crate::error::kind_of(&e) == ErrorKind::InvalidInput,
                message: crate::error::one_line(&e),
            },
        }
    }
}

pub fn write_frame<T: Serialize>(w: &mut impl Write, msg: &T) -> io::Result<()> {
    let body = serde_json::to_vec(msg)?;
    let len = u32::try_from(body.len()).ok().filter(|&n| n as usize <= MAX_FRAME);
    let len = len.ok_or_else(|| io::Error::other("chat template frame too large"))?;
    w.write_all(&len.to_le_bytes())?;
    w.write_all(&body)?;
    w.flush()
}

/// The next frame's bytes, or `None` at end of input before a frame begins.
pub fn read_frame(r: &mut impl Read) -> io::Result<Option<Vec<u8>>> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = frame_len(len)?;
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)?;
    Ok(Some(body))
}

/// The length a frame's 4-byte prefix gives, refused past [`MAX_FRAME`].
pub fn frame_len(prefix: [u8; 4]) -> io::Result<usize> {
    let len = u32::from_le_bytes(prefix) as usize;
    if len > MAX_FRAME {
        return Err(io::Error::other(format!("chat template frame of {len} bytes")));
    }
    Ok(len)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_end_cleanly() {
        let mut buf = Vec::new();
        write_frame(&mut buf, &Reply::Rendered("héllo".into())).unwrap();
        write_frame(&mut buf, &Reply::Ready).unwrap();
        let mut r = &buf[..];
        let first: Reply = serde_json::from_slice(&read_frame(&mut r).unwrap().unwrap()).unwrap();
        assert_eq!(first.into_result().unwrap(), "héllo");
        let second: Reply = serde_json::from_slice(&read_frame(&mut r).unwrap().unwrap()).unwrap();
        assert!(matches!(second, Reply::Ready));
        assert!(read_frame(&mut r).unwrap().is_none());
        // A frame cut short is an error, not the end.
        let mut cut = &buf[..6];
        assert!(read_frame(&mut cut).is_err());
    }

    #[test]
    fn an_oversized_length_is_refused_before_allocating() {
        let mut r = &u32::MAX.to_le_bytes()[..];
        assert!(read_frame(&mut r).unwrap_err().to_string().contains("frame of 4294967295 bytes"));
    }

    #[test]
    fn failures_keep_their_kind() {
        let e = Reply::from_result(Err(fail(ErrorKind::InvalidInput, "bad"))).into_result();
        let e = e.unwrap_err();
        assert_eq!(crate::error::kind_of(&e), ErrorKind::InvalidInput);
        assert_eq!(e.to_string(), "bad");
        let retired = Reply::Retiring(Box::new(Reply::from_result(Err(anyhow::anyhow!("x")))));
        assert_eq!(crate::error::kind_of(&retired.into_result().unwrap_err()), ErrorKind::Other);
    }
}
