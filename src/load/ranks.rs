//! Tensor-parallel ranks as processes, one per GPU (docs/tensor-parallel.md, "Ranks as processes").
//! Rank 0 runs the front end (play, serve, bench), the scheduler and the sampler; every other rank
//! loads its slice of the model and follows the steps rank 0 sends it (`engine/ranks.rs`). The
//! ranks meet as torchrun's launchers have them meet: `RANK`, `WORLD_SIZE`, `MASTER_ADDR`,
//! `MASTER_PORT` and `LOCAL_RANK` in each process's environment, so that srun, mpirun or a shell
//! loop on several machines can start them. Without those variables, `--tp N` makes rank 0 start
//! the other N − 1 on this machine itself: the same command line again, with the variables set.
//!
//! Rank 0 listens on `MASTER_ADDR:MASTER_PORT`; each rank connects and the group agrees over
//! that connection (length-prefixed frames): rank 0 sends NCCL's id and what to load, each rank
//! answers once loaded and once its KV pool is allocated, and then every step follows. A rank
//! whose connection closes (it exited, or was killed) ends the others: rank 0 exits with code 9
//! naming the rank, and a rank whose rank 0 is gone exits too. A rank that hangs ends them the
//! same way: the ranks beat to each other, and a peer silent for 20 s is hung (`beats.rs`).
//! Ranks rank 0 started die with it (`PR_SET_PDEATHSIG`).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::beats::{self, BEAT, HANG, Silence};
use crate::error::{ErrorKind, fail};

/// This process's place in a group, from the launcher's variables.
#[derive(Debug, Clone)]
pub struct Rendezvous {
    pub rank: usize,
    pub world: usize,
    /// The GPU on this machine, counted from `--gpu`.
    pub local_rank: usize,
    pub addr: String,
    pub port: u16,
}

impl Rendezvous {
    /// From `RANK`, `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT` and `LOCAL_RANK` (default: `RANK`),
    /// when `RANK` is set.
    pub fn from_env() -> anyhow::Result<Option<Rendezvous>> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let Some(rank) = var("RANK") else { return Ok(None) };
        let num = |k: &str, v: Option<String>| -> anyhow::Result<usize> {
            let v = v.ok_or_else(|| bad(format!("RANK is set but {k} is not")))?;
            v.parse().map_err(|_| bad(format!("{k}={v} is not a whole number")))
        };
        let rank = num("RANK", Some(rank))?;
        let world = num("WORLD_SIZE", var("WORLD_SIZE"))?;
        let local_rank = match var("LOCAL_RANK") {
            Some(v) => num("LOCAL_RANK", Some(v))?,
            None => rank,
        };
        let addr = var("MASTER_ADDR").ok_or_else(|| bad("RANK is set but MASTER_ADDR is not"))?;
        let port = num("MASTER_PORT", var("MASTER_PORT"))?;
        let port =
            u16::try_from(port).map_err(|_| bad(format!("MASTER_PORT={port} is not a port")))?;
        if rank >= world {
            return Err(bad(format!("RANK={rank} is not below WORLD_SIZE={world}")));
        }
        Ok(Some(Rendezvous { rank, world, local_rank, addr, port }))
    }
}

fn bad(msg: impl Into<String>) -> anyhow::Error {
    fail(ErrorKind::InvalidInput, msg.into())
}

fn rank_failed(msg: impl Into<String>) -> anyhow::Error {
    fail(ErrorKind::Rank, msg.into())
}

/// What this process is for a command run with `--tp N`.
pub enum Role {
    /// The whole model here (`--tp 1`).
    Single,
    /// Rank 0 of N: the front end runs here.
    Leader(Leader),
}

impl Role {
    /// The GPU this process runs on: `--gpu` (`first`), counted on by `LOCAL_RANK` for a rank a
    /// launcher started (as the other ranks count theirs).
    pub fn gpu(&self, first: usize) -> usize {
        match self {
            Role::Single => first,
            Role::Leader(l) => first + l.rv.local_rank,
        }
    }
}

/// Decides this process's role for `--tp tp`. A rank other than 0 (its `RANK` says so) runs as a
/// follower and never returns: it exits when rank 0 stops. `gpu` is `--gpu`, the first GPU.
pub fn role(tp: usize, gpu: usize, cpu: bool) -> anyhow::Result<Role> {
    if tp == 0 {
        return Err(bad("--tp must be at least 1"));
    }
    if tp == 1 {
        return Ok(Role::Single);
    }
    if cpu {
        return Err(bad("--tp above 1 runs on GPUs (NCCL); --cpu takes one rank"));
    }
    quiet_multicast();
    match Rendezvous::from_env()? {
        Some(rv) if rv.world != tp => {
            Err(bad(format!("--tp {tp} but WORLD_SIZE={}: they must agree", rv.world)))
        }
        Some(rv) if rv.rank > 0 => {
            if let Err(e) = follower::run(&rv, gpu) {
                // Its GPU may still wait in a collective: no exit handlers (exit_now).
                eprintln!("inferno (rank {}): {}", rv.rank, crate::error::one_line(&e));
                crate::error::exit_now(crate::error::kind_of(&e));
            }
            if crate::switches::tp_trace() {
                eprintln!("inferno tp rank {}: exiting (0)", rv.rank);
            }
            std::process::exit(0)
        }
        Some(rv) => {
            let addr = format!("{}:{}", rv.addr, rv.port);
            let listener = TcpListener::bind(&addr)
                .map_err(|e| rank_failed(format!("rank 0 cannot listen on {addr}: {e}")))?;
            Ok(Role::Leader(Leader { rv, listener, children: Vec::new() }))
        }
        None => {
            enough_gpus(tp, gpu)?;
            Leader::spawn(tp).map(Role::Leader)
        }
    }
}

/// Ranks started on this machine take GPUs `gpu..gpu + tp`: refused in one line (exit code 8)
/// before any rank starts when the driver sees fewer. Without a driver, opening the device says
/// why.
fn enough_gpus(tp: usize, gpu: usize) -> anyhow::Result<()> {
    let Ok(driver) = crate::gpu::probe::driver() else { return Ok(()) };
    let last = gpu + tp - 1;
    if last < driver.devices {
        return Ok(());
    }
    Err(fail(
        ErrorKind::NoDevice,
        format!(
            "--tp {tp} needs GPUs {gpu}…{last} (from --gpu {gpu}), but the NVIDIA driver sees {}",
            driver.devices
        ),
    ))
}

/// NVLink multicast stays off (`NCCL_NVLS_ENABLE=0` unless the user set it): many hosts lack it,
/// and on shared machines a program that uses it can take the GPUs out of service.
fn quiet_multicast() {
    if std::env::var_os("NCCL_NVLS_ENABLE").is_none() {
        // SAFETY: called on the main thread before any rank's engine or NCCL thread exists.
        unsafe { std::env::set_var("NCCL_NVLS_ENABLE", "0") };
    }
}

/// Rank 0: the connections to the other ranks, once they have joined.
pub struct Leader {
    pub rv: Rendezvous,
    listener: TcpListener,
    children: Vec<std::process::Child>,
}

/// Rank 0 → others: what to load.
#[derive(Serialize, Deserialize)]
struct Setup {
    nccl_id: Vec<u8>,
    model: String,
    dtype: Option<String>,
    context: usize,
    dummy: bool,
    kv_dtype: crate::models::batch::KvDtype,
}

/// Rank 0 → others: the engine's size, for a KV pool of the same blocks.
#[derive(Serialize, Deserialize)]
struct Pool {
    max_seqs: usize,
    kv_tokens: usize,
    token_budget: usize,
}

/// Others → rank 0: a phase done, or why not.
#[derive(Serialize, Deserialize)]
struct Reply {
    rank: usize,
    error: Option<String>,
}

impl Leader {
    /// Rank 0 of `tp` ranks on this machine: listens on a free local port and starts ranks
    /// 1..tp as copies of this process (same arguments), on GPUs `--gpu + rank`.
    fn spawn(tp: usize) -> anyhow::Result<Leader> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let exe = std::env::current_exe()?;
        let mut children = Vec::with_capacity(tp - 1);
        for rank in 1..tp {
            let mut cmd = std::process::Command::new(&exe);
            cmd.args(std::env::args_os().skip(1))
                .env("RANK", rank.to_string())
                .env("WORLD_SIZE", tp.to_string())
                .env("LOCAL_RANK", rank.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", port.to_string())
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null());
            die_with_parent(&mut cmd);
            children
                .push(cmd.spawn().map_err(|e| rank_failed(format!("starting rank {rank}: {e}")))?);
        }
        let rv = Rendezvous { rank: 0, world: tp, local_rank: 0, addr: "127.0.0.1".into(), port };
        Ok(Leader { rv, listener, children })
    }

    /// Waits for every other rank, sends them NCCL's id and what to load, and joins the group:
    /// rank 0's end of it, and the connections (in rank order) to finish with [`Leader::ready`].
    pub fn join(
        &mut self,
        model: &str,
        dtype: Option<String>,
        context: usize,
        (dummy, kv_dtype): (bool, crate::models::batch::KvDtype),
        device: &candle_core::Device,
    ) -> anyhow::Result<(Arc<dyn crate::dist::Collective>, Group)> {
        let conns = self.accept()?;
        let id = nccl_id()?;
        let setup =
            Setup { nccl_id: id.to_vec(), model: model.into(), dtype, context, dummy, kv_dtype };
        let mut group = Group {
            conns,
            children: std::mem::take(&mut self.children),
            stopping: Arc::default(),
            writing: Arc::default(),
        };
        for (_, c) in &mut group.conns {
            write_json(c, &setup)?;
        }
        // A rank that fails before it joins (its GPU missing, say) leaves NCCL's join waiting
        // for it forever: its connection closing ends the wait.
        let joined = Arc::new(AtomicBool::new(false));
        let guard = guard_join(&group.conns, joined.clone())?;
        let comm = join_nccl(&id, 0, self.rv.world, device);
        joined.store(true, Ordering::SeqCst);
        let _ = guard.join();
        Ok((comm?, group))
    }

    /// The other ranks' connections, in rank order, once each has said which rank it is.
    fn accept(&mut self) -> anyhow::Result<Vec<(usize, TcpStream)>> {
        let deadline = Instant::now() + crate::switches::tp_join_timeout();
        self.listener.set_nonblocking(true)?;
        let mut conns: Vec<(usize, TcpStream)> = Vec::new();
        while conns.len() + 1 < self.rv.world {
            for child in &mut self.children {
                if let Some(status) = child.try_wait()? {
                    return Err(rank_failed(format!("a rank exited before joining ({status})")));
                }
            }
            match self.listener.accept() {
                Ok((mut s, _)) => {
                    s.set_nonblocking(false)?;
                    s.set_nodelay(true)?;
                    s.set_read_timeout(Some(Duration::from_secs(30)))?;
                    let hello: Reply = read_json(&mut s)?;
                    s.set_read_timeout(None)?;
                    let ok = hello.rank > 0
                        && hello.rank < self.rv.world
                        && conns.iter().all(|(r, _)| *r != hello.rank);
                    if !ok {
                        return Err(rank_failed(format!(
                            "a process joined as rank {}, which is taken or out of range",
                            hello.rank
                        )));
                    }
                    conns.push((hello.rank, s));
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if Instant::now() > deadline {
                        let missing: Vec<String> = (1..self.rv.world)
                            .filter(|r| conns.iter().all(|(c, _)| c != r))
                            .map(|r| r.to_string())
                            .collect();
                        return Err(rank_failed(format!(
                            "rank(s) {} did not join rank 0 at {}:{} within {} s",
                            missing.join(", "),
                            self.rv.addr,
                            self.rv.port,
                            crate::switches::tp_join_timeout().as_secs()
                        )));
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => return Err(e.into()),
            }
        }
        conns.sort_by_key(|(r, _)| *r);
        Ok(conns)
    }
}

/// Rank 0's connections to the other ranks: the runner's [`Followers`](crate::engine::ranks::Followers).
pub struct Group {
    conns: Vec<(usize, TcpStream)>,
    children: Vec<std::process::Child>,
    /// Set once rank 0 stops them: their connections closing is then no failure.
    stopping: Arc<AtomicBool>,
    /// Held by each write to the connections: the steps' and the beats' (`beats.rs`).
    writing: Arc<Mutex<()>>,
}

impl Group {
    /// Each rank's answer to the phase just asked (loading, the pool): the first failure, named.
    fn collect(&mut self, phase: &str) -> anyhow::Result<()> {
        for (rank, c) in &mut self.conns {
            let reply: Reply = read_json(c)
                .map_err(|e| rank_failed(format!("rank {rank} exited while {phase} ({e})")))?;
            if let Some(e) = reply.error {
                return Err(rank_failed(format!("rank {rank}: {e}")));
            }
        }
        Ok(())
    }

    /// Every rank loaded its slice: sends the engine's size, waits for their pools, and watches
    /// their connections from then on.
    pub fn ready(mut self, cfg: &crate::engine::core::EngineConfig) -> anyhow::Result<Self> {
        self.collect("loading")?;
        let pool = Pool {
            max_seqs: cfg.max_seqs,
            kv_tokens: cfg.kv_tokens,
            token_budget: cfg.token_budget,
        };
        for (_, c) in &mut self.conns {
            write_json(c, &pool)?;
        }
        self.collect("allocating its KV cache")?;
        let mut beat = Vec::with_capacity(self.conns.len());
        for (rank, c) in &self.conns {
            watch(*rank, c.try_clone()?, self.stopping.clone());
            beat.push(c.try_clone()?);
        }
        beats::beat_to_followers(beat, self.writing.clone(), self.stopping.clone(), BEAT)?;
        Ok(self)
    }
}

/// While rank 0 joins NCCL: exits (code 9, naming the rank) when a rank's connection closes
/// before every rank has joined. Peeks, so nothing the ranks send is consumed.
fn guard_join(
    conns: &[(usize, TcpStream)],
    joined: Arc<AtomicBool>,
) -> anyhow::Result<std::thread::JoinHandle<()>> {
    let mut peers = Vec::with_capacity(conns.len());
    for (rank, c) in conns {
        let c = c.try_clone()?;
        c.set_read_timeout(Some(Duration::from_millis(100)))?;
        peers.push((*rank, c));
    }
    Ok(std::thread::Builder::new().name("inferno-join".into()).spawn(move || {
        let mut byte = [0u8; 1];
        while !joined.load(Ordering::SeqCst) {
            for (rank, c) in &peers {
                if matches!(c.peek(&mut byte), Ok(0)) && !joined.load(Ordering::SeqCst) {
                    eprintln!("inferno: rank {rank} exited before joining the group; stopping");
                    crate::error::exit_now(ErrorKind::Rank);
                }
            }
            // A rank that has data waiting (it joined and loaded first) answers peeks at once.
            std::thread::sleep(Duration::from_millis(10));
        }
        for (_, c) in &peers {
            let _ = c.set_read_timeout(None);
        }
    })?)
}

/// Ends rank 0 when rank `rank`'s connection closes, or its beats stop, while the group runs: a
/// rank that died or hangs leaves the others waiting in a collective forever.
fn watch(rank: usize, mut conn: TcpStream, stopping: Arc<AtomicBool>) {
    let _ = std::thread::Builder::new().name(format!("inferno-rank-{rank}")).spawn(move || {
        let how = beats::wait_silence(&mut conn, HANG);
        if stopping.load(Ordering::SeqCst) {
            return;
        }
        match how {
            Silence::Closed => eprintln!("inferno: rank {rank} exited; stopping every rank"),
            Silence::Hung => eprintln!(
                "inferno: rank {rank} gave no sign of life for {} s (hung); stopping every rank",
                HANG.as_secs()
            ),
        }
        crate::error::exit_now(ErrorKind::Rank);
    });
}

impl crate::engine::ranks::Followers for Group {
    fn send(&mut self, words: Vec<u32>) -> anyhow::Result<()> {
        let _held = self.writing.lock().map_err(|_| rank_failed("a beat thread panicked"))?;
        for (rank, c) in &mut self.conns {
            write_words(c, &words)
                .map_err(|e| rank_failed(format!("rank {rank} is gone ({e})")))?;
        }
        Ok(())
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        let trace = crate::switches::tp_trace();
        if trace {
            eprintln!("inferno tp rank 0: stopping the other ranks");
        }
        self.stopping.store(true, Ordering::SeqCst);
        let stop = crate::engine::ranks::encode_stop();
        let held = self.writing.lock();
        for (_, c) in &mut self.conns {
            let _ = write_words(c, &stop);
        }
        drop(held);
        // The ranks rank 0 started: give them a moment to exit cleanly.
        let deadline = Instant::now() + Duration::from_secs(10);
        for child in &mut self.children {
            while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        if trace {
            eprintln!("inferno tp rank 0: the other ranks stopped");
        }
    }
}

/// A child that gets SIGKILL when its parent exits, however it exits.
fn die_with_parent(cmd: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
}

#[cfg(feature = "cuda")]
fn nccl_id() -> anyhow::Result<[u8; 128]> {
    let id = crate::dist::nccl::unique_id()?;
    Ok(id.internal.map(|c| c as u8))
}

#[cfg(not(feature = "cuda"))]
fn nccl_id() -> anyhow::Result<[u8; 128]> {
    Err(bad("--tp above 1 needs a build with CUDA"))
}

#[cfg(feature = "cuda")]
fn join_nccl(
    id: &[u8],
    rank: usize,
    world: usize,
    device: &candle_core::Device,
) -> anyhow::Result<Arc<dyn crate::dist::Collective>> {
    use crate::dist::nccl::{NcclComm, UniqueId};
    let bytes: [u8; 128] = id.try_into().map_err(|_| rank_failed("a malformed NCCL id"))?;
    let id = UniqueId { internal: bytes.map(|b| b as std::ffi::c_char) };
    let shard = crate::dist::Shard::new(rank, world)?;
    Ok(Arc::new(NcclComm::join(id, shard, device)?))
}

#[cfg(not(feature = "cuda"))]
fn join_nccl(
    _: &[u8],
    _: usize,
    _: usize,
    _: &candle_core::Device,
) -> anyhow::Result<Arc<dyn crate::dist::Collective>> {
    Err(bad("--tp above 1 needs a build with CUDA"))
}

/// A frame: its length (u32, little-endian) and its bytes.
fn write_frame(c: &mut TcpStream, bytes: &[u8]) -> std::io::Result<()> {
    let len = u32::try_from(bytes.len()).map_err(std::io::Error::other)?;
    // One write: a frame split in two waits for the peer's delayed ACK (Nagle).
    let mut frame = Vec::with_capacity(4 + bytes.len());
    frame.extend_from_slice(&len.to_le_bytes());
    frame.extend_from_slice(bytes);
    c.write_all(&frame)
}

/// Frames above this are a broken peer, not a step (a step of 64 sequences of 128k tokens is
/// ~2 MB).
const MAX_FRAME: usize = 256 << 20;

fn read_frame(c: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    c.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(std::io::Error::other(format!("a frame of {len} bytes")));
    }
    let mut buf = vec![0u8; len];
    c.read_exact(&mut buf)?;
    Ok(buf)
}

fn write_json<T: Serialize>(c: &mut TcpStream, v: &T) -> anyhow::Result<()> {
    Ok(write_frame(c, &serde_json::to_vec(v)?)?)
}

fn read_json<T: for<'de> Deserialize<'de>>(c: &mut TcpStream) -> anyhow::Result<T> {
    Ok(serde_json::from_slice(&read_frame(c)?)?)
}

fn write_words(c: &mut TcpStream, words: &[u32]) -> std::io::Result<()> {
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    write_frame(c, &bytes)
}

fn read_words(c: &mut TcpStream) -> std::io::Result<Vec<u32>> {
    let bytes = read_frame(c)?;
    if bytes.len() % 4 != 0 {
        return Err(std::io::Error::other("a step frame of a partial word"));
    }
    Ok(bytes.chunks_exact(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect())
}

/// A rank other than 0.
mod follower {
    use super::*;
    use crate::engine::core::EngineConfig;
    use crate::engine::pool::runner_with_pool;

    pub fn run(rv: &Rendezvous, gpu: usize) -> anyhow::Result<()> {
        let mut conn = connect(rv)?;
        write_json(&mut conn, &Reply { rank: rv.rank, error: None })?;
        let setup: Setup = read_json(&mut conn).map_err(|e| gone(rv, e))?;
        let (device, _) = crate::load::open_device(gpu + rv.local_rank, false)?;
        let comm = join_nccl(&setup.nccl_id, rv.rank, rv.world, &device)?;
        let opts = crate::load::LoadOptions {
            dtype: setup.dtype.as_deref().map(crate::load::parse_dtype).transpose()?,
            context: Some(setup.context),
            dummy: setup.dummy,
            kv_dtype: setup.kv_dtype,
        };
        let loaded = crate::load::load_rank(&setup.model, &opts, &device, comm);
        let model = answer(&mut conn, rv.rank, loaded)?.model;
        let pool: Pool = read_json(&mut conn).map_err(|e| gone(rv, e))?;
        let cfg = EngineConfig {
            max_seqs: pool.max_seqs,
            kv_tokens: pool.kv_tokens,
            token_budget: pool.token_budget,
            pipeline: false,
            spec: None,
        };
        let (mut runner, _) = answer(&mut conn, rv.rank, runner_with_pool(model, &cfg.pool()))?;
        beats::beat_to_leader(conn.try_clone()?, BEAT)?;
        // Steps arrive on their own thread: a rank stuck in a collective whose peer died or
        // hangs must still see rank 0's connection close or its beats stop, and exit.
        let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<u32>>(64);
        let rank = rv.rank;
        conn.set_read_timeout(Some(HANG))?;
        std::thread::Builder::new().name("inferno-steps".into()).spawn(move || {
            loop {
                match read_words(&mut conn) {
                    Ok(words) if words.is_empty() => {} // a beat
                    Ok(words) => {
                        let stop = words == crate::engine::ranks::encode_stop();
                        if tx.send(words).is_err() || stop {
                            return;
                        }
                    }
                    Err(e) => {
                        let hung = matches!(
                            e.kind(),
                            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                        );
                        match hung {
                            true => eprintln!(
                                "inferno (rank {rank}): rank 0 gave no sign of life for {} s \
                                 (hung); exiting",
                                HANG.as_secs()
                            ),
                            false => eprintln!("inferno (rank {rank}): rank 0 is gone; exiting"),
                        }
                        crate::error::exit_now(ErrorKind::Rank);
                    }
                }
            }
        })?;
        runner.follow(|| rx.recv().map_err(|_| rank_failed("the step reader stopped")))
    }

    /// Tells rank 0 how a phase went; the phase's value, or its error.
    fn answer<T>(conn: &mut TcpStream, rank: usize, r: anyhow::Result<T>) -> anyhow::Result<T> {
        let error = r.as_ref().err().map(crate::error::one_line);
        write_json(conn, &Reply { rank, error })?;
        r
    }

    fn gone(rv: &Rendezvous, e: anyhow::Error) -> anyhow::Error {
        rank_failed(format!("rank 0 at {}:{} went away ({e})", rv.addr, rv.port))
    }

    /// Connects to rank 0, retrying until it listens (it may start after this rank).
    fn connect(rv: &Rendezvous) -> anyhow::Result<TcpStream> {
        let deadline = Instant::now() + crate::switches::tp_join_timeout();
        let target = format!("{}:{}", rv.addr, rv.port);
        loop {
            let addrs = target.to_socket_addrs();
            let attempt = addrs
                .ok()
                .and_then(|mut a| a.next())
                .map(|a| TcpStream::connect_timeout(&a, Duration::from_secs(5)));
            match attempt {
                Some(Ok(s)) => {
                    s.set_nodelay(true)?;
                    return Ok(s);
                }
                _ if Instant::now() > deadline => {
                    return Err(rank_failed(format!(
                        "rank {} could not reach rank 0 at {target} within {} s (MASTER_ADDR / MASTER_PORT)",
                        rv.rank,
                        crate::switches::tp_join_timeout().as_secs()
                    )));
                }
                _ => std::thread::sleep(Duration::from_millis(200)),
            }
        }
    }
}
