//! Signs of life between tensor-parallel ranks (`ranks.rs`), so that a rank that hangs ends the
//! others as a rank that dies does.
//!
//! A rank that exits closes its connection, and the others see that at once. A rank that is
//! stopped (SIGSTOP, a debugger, a machine that froze, a network that dropped its packets)
//! closes nothing: its peers would wait in their next collective forever. NCCL never times a
//! collective out, and the GPUs' peer-memory sums (`dist/p2p.rs`) do only within a step. So
//! every rank beats: rank 0 sends an empty step frame to each other rank every [`BEAT`], and
//! each other rank sends rank 0 one byte every [`BEAT`], from threads of their own (a rank busy
//! in a long step still beats). A peer that has sent nothing for [`HANG`] is hung; the rank that
//! notices prints one line naming it and exits with code 9, and the others follow when its
//! connections close.
//!
//! What beats do not see: a process whose threads run while its GPU is stuck in a kernel. Its
//! peer-memory sums trap after 30 s; through NCCL the group waits.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How often a rank beats.
pub const BEAT: Duration = Duration::from_secs(1);
/// Silence after which a peer counts as hung: well inside the 30 s a hung rank may take to end
/// the group, and 20 beats, so a busy host does not trip it.
pub const HANG: Duration = Duration::from_secs(20);

/// How a peer's connection ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Silence {
    /// Closed (the peer exited) or broken.
    Closed,
    /// Open, but nothing came for the whole `hang`.
    Hung,
}

/// Reads `conn` (the beats, bytes nobody else reads) until it closes or stays silent for
/// `hang`.
pub fn wait_silence(conn: &mut TcpStream, hang: Duration) -> Silence {
    if conn.set_read_timeout(Some(hang)).is_err() {
        return Silence::Closed;
    }
    let mut buf = [0u8; 64];
    loop {
        match conn.read(&mut buf) {
            Ok(0) => return Silence::Closed,
            Ok(_) => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return Silence::Hung;
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return Silence::Closed,
        }
    }
}

/// A rank other than 0: one byte to rank 0 every `every`, on a thread of its own, until the
/// connection breaks. Nothing else writes to rank 0 once the rank has joined.
pub fn beat_to_leader(mut conn: TcpStream, every: Duration) -> std::io::Result<()> {
    std::thread::Builder::new().name("inferno-beat".into()).spawn(move || {
        while conn.write_all(&[0]).is_ok() {
            std::thread::sleep(every);
        }
    })?;
    Ok(())
}

/// Rank 0: an empty frame (the beat the other ranks' step readers skip) to every rank every
/// `every`, under `lock`, which the step frames' writes also hold (two writers interleaving
/// their bytes would corrupt both frames), until `stopping`.
pub fn beat_to_followers(
    conns: Vec<TcpStream>,
    lock: Arc<Mutex<()>>,
    stopping: Arc<AtomicBool>,
    every: Duration,
) -> std::io::Result<()> {
    std::thread::Builder::new().name("inferno-beat".into()).spawn(move || {
        let mut conns = conns;
        while !stopping.load(Ordering::SeqCst) {
            {
                let Ok(_held) = lock.lock() else { return };
                for c in &mut conns {
                    // A broken connection is the watch threads' to report.
                    let _ = c.write_all(&0u32.to_le_bytes());
                }
            }
            std::thread::sleep(every);
        }
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
    use std::time::Instant;

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        (a, l.accept().unwrap().0)
    }

    /// Beats keep a peer alive past many silences' worth of time; a stopped beater is hung
    /// after about `hang`; a closed connection is closed at once.
    #[test]
    fn beats_keep_alive_and_silence_is_hung() {
        let (beater, mut watched) = pair();
        let stop = Arc::new(AtomicBool::new(false));
        let sender = {
            let stop = stop.clone();
            let mut b = beater.try_clone().unwrap();
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    b.write_all(&[0]).unwrap();
                    std::thread::sleep(Duration::from_millis(20));
                }
            })
        };
        let watcher = std::thread::spawn(move || {
            let t = Instant::now();
            (wait_silence(&mut watched, Duration::from_millis(300)), t.elapsed())
        });
        std::thread::sleep(Duration::from_millis(1200));
        stop.store(true, Ordering::SeqCst);
        sender.join().unwrap();
        let (how, after) = watcher.join().unwrap();
        assert_eq!(how, Silence::Hung);
        assert!(after >= Duration::from_millis(1200), "hung while beats came ({after:?})");
        assert!(after < Duration::from_millis(3000), "silence noticed late ({after:?})");
        drop(beater);

        let (closer, mut watched) = pair();
        let t = Instant::now();
        drop(closer);
        assert_eq!(wait_silence(&mut watched, Duration::from_secs(30)), Silence::Closed);
        assert!(t.elapsed() < Duration::from_secs(5));
    }

    /// The leader's beats are empty frames, written whole under the lock, and stop with
    /// `stopping`; the follower's beats are bytes.
    #[test]
    fn leader_beats_are_empty_frames_and_stop() {
        let (a, mut b) = pair();
        let (lock, stopping) = (Arc::new(Mutex::new(())), Arc::new(AtomicBool::new(false)));
        // The group keeps its own handle: the connection stays open once the beats stop.
        let beats = vec![a.try_clone().unwrap()];
        beat_to_followers(beats, lock, stopping.clone(), Duration::from_millis(10)).unwrap();
        let mut frame = [0xffu8; 4];
        for _ in 0..5 {
            b.read_exact(&mut frame).unwrap();
            assert_eq!(frame, [0, 0, 0, 0], "a beat is a frame of no bytes");
        }
        stopping.store(true, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(50));
        b.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        while b.read(&mut frame).is_ok() {}
        assert_eq!(wait_silence(&mut b, Duration::from_millis(200)), Silence::Hung);
        drop(a);

        let (c, mut d) = pair();
        beat_to_leader(c, Duration::from_millis(10)).unwrap();
        let mut byte = [1u8];
        d.read_exact(&mut byte).unwrap();
        assert_eq!(byte, [0]);
    }
}
