//! Faults on the GPU: the device runs out of memory in the middle of serving. Another process
//! (this test) takes all of the GPU's free memory while `inferno serve` streams a reply; a
//! request that needs more memory than the server's steps have had fails with a 503 that says
//! so, the stream decoding beside it goes on to its end, and once the memory is free again the
//! same request succeeds. `#[ignore]`d without a GPU (scripts/gpu-tests.sh runs it).
#![cfg(feature = "cuda")]

mod common;

use std::io::Read;
use std::time::{Duration, Instant};

use candle_core::{DType, Device, Tensor};
use common::serve::{Server, post, send_post};

fn chat(content: &str, max_tokens: usize, stream: bool) -> String {
    serde_json::json!({
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": stream,
    })
    .to_string()
}

/// Device memory held until dropped: as much as the GPU will give, in halving pieces down to
/// 64 KiB, so that what is left is less than any step needs anew.
struct Hog {
    device: Device,
    pieces: Vec<Tensor>,
}

impl Hog {
    fn take() -> Hog {
        let (device, _) = inferno::gpu::open(0).expect("a CUDA device");
        let mut pieces = Vec::new();
        let mut size = 1usize << 30;
        while size >= 64 << 10 {
            match Tensor::zeros(size, DType::U8, &device) {
                Ok(t) => pieces.push(t),
                Err(_) => size /= 2,
            }
        }
        device.synchronize().expect("sync");
        Hog { device, pieces }
    }

    fn bytes(&self) -> usize {
        self.pieces.iter().map(|t| t.elem_count()).sum()
    }

    /// Frees every piece, back to the driver (this process's pool keeps what it frees).
    fn release(mut self) -> u64 {
        self.pieces.clear();
        inferno::gpu::available(&self.device).expect("free memory")
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on a GPU machine (scripts/gpu-tests.sh)"]
fn gpu_out_of_memory_fails_the_request_that_needs_it_and_serve_goes_on() {
    let model = common::tiny_gpt_oss_full_vocab();
    let s = Server::start_gpu(&model, &["--context", "16384", "--kv-tokens", "65536"], &[]);
    let words = |n: usize| (0..n).map(|i| format!("w{}", i % 97)).collect::<Vec<_>>().join(" ");
    // Steps of every kind the stream below takes have run: decode graphs are captured.
    for (prompt, max) in [(words(8), 64), (words(300), 64)] {
        let (status, out) = post(&s.addr, "/v1/chat/completions", &chat(&prompt, max, false));
        assert_eq!(status, 200, "{out}");
    }

    // A long reply streams through the fault.
    let addr = s.addr.clone();
    let (started_tx, started) = std::sync::mpsc::channel();
    let stream = std::thread::spawn(move || {
        let body = chat("Tell a long story.", 4000, true);
        let mut c = send_post(&addr, "/v1/chat/completions", &body);
        c.set_read_timeout(Some(Duration::from_secs(300))).expect("timeout");
        let mut first = [0u8; 256];
        let n = c.read(&mut first).expect("first bytes");
        let _ = started_tx.send(());
        let mut rest = String::new();
        c.read_to_string(&mut rest).expect("read");
        format!("{}{rest}", String::from_utf8_lossy(&first[..n]))
    });
    started.recv_timeout(Duration::from_secs(60)).expect("the stream started");

    let t0 = Instant::now();
    let hog = Hog::take();
    eprintln!("hog: {} MiB in {:.2?}", hog.bytes() >> 20, t0.elapsed());
    let long = chat(&words(3000), 16, false);
    let (status, out) = post(&s.addr, "/v1/chat/completions", &long);
    assert_eq!(status, 503, "{out}");
    // Its prompt's step, or (the prompt's memory being there) its first decode step in a batch
    // of two, which no step has had before, fails.
    assert!(out.contains("the GPU ran out of memory"), "{out}");
    assert!(out.to_ascii_lowercase().contains("retry-after:"), "{out}");
    let free = hog.release();
    eprintln!("memory back: {} MiB free", free >> 20);

    // The stream decoded on to its end; the same request now succeeds, and so does a short one.
    let reply = stream.join().expect("stream thread");
    let end: String = reply.chars().skip(reply.chars().count().saturating_sub(600)).collect();
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(!reply.contains("\"error\""), "the stream failed: {end}");
    assert!(reply.contains("[DONE]"), "{end}");
    let (status, out) = post(&s.addr, "/v1/chat/completions", &long);
    assert_eq!(status, 200, "{out}");
    let (status, out) = post(&s.addr, "/v1/chat/completions", &chat("Say hello.", 8, false));
    assert_eq!(status, 200, "{out}");
    let log = s.log();
    assert!(log.contains("ran out of device memory"), "{log}");
    assert!(!log.contains("panicked"), "{log}");
}
