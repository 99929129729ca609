use super::*;

/// On the CPU: the host respelling, shaped; sources that are not whole equal rows are an
/// error, not a panic.
#[test]
fn host_respelling_shaped_and_bad_sources_refused() {
    let raw: Vec<u8> = (0..17 * 12).map(|i| (i * 73 + 5) as u8).collect();
    let (a, b) = raw.split_at(17 * 6);
    let (codes, scales) = ggml_rows_to_hf_on(&[a, b], 3, &Device::Cpu).expect("respell");
    assert_eq!((codes.dims(), scales.dims()), (&[4, 3, 16][..], &[4, 3][..]));
    let (want_codes, want_scales) = mxfp4::ggml_rows_to_hf(&[a, b], 3);
    assert_eq!(codes.flatten_all().and_then(|t| t.to_vec1::<u8>()).expect("c"), want_codes);
    assert_eq!(scales.flatten_all().and_then(|t| t.to_vec1::<u8>()).expect("s"), want_scales);
    assert!(ggml_rows_to_hf_on(&[a, &b[1..]], 3, &Device::Cpu).is_err());
    assert!(ggml_rows_to_hf_on(&[&raw[1..]], 3, &Device::Cpu).is_err());
    assert!(ggml_rows_to_hf_on(&[a, a, a], 3, &Device::Cpu).is_err());
    assert!(ggml_rows_to_hf_on(&[], 3, &Device::Cpu).is_err());
}

#[cfg(feature = "cuda")]
mod gpu {
    use rand::{Rng, RngCore};

    use super::super::*;
    use crate::kernels::testing::{gpu, rng};

    /// The kernel gives the host respelling's bytes exactly, for one source and for two (fused),
    /// on random blocks in random shapes (row lengths not multiples of anything).
    #[test]
    #[ignore = "needs a CUDA GPU: cargo test --release --lib kernels -- --ignored"]
    fn gpu_respelling_matches_the_host() {
        let dev = gpu();
        let mut r = rng("mxfp4_ggml gpu");
        for case in 0..12 {
            let (rows, row_blocks) = (r.random_range(1..300), r.random_range(1..100));
            let n = 1 + case % 2;
            let srcs: Vec<Vec<u8>> = (0..n)
                .map(|_| {
                    let mut v = vec![0u8; rows * row_blocks * GGML_BLOCK_BYTES];
                    r.fill_bytes(&mut v);
                    v
                })
                .collect();
            let refs: Vec<&[u8]> = srcs.iter().map(Vec::as_slice).collect();
            let (want_codes, want_scales) = mxfp4::ggml_rows_to_hf(&refs, row_blocks);
            let (codes, scales) = ggml_rows_to_hf_on(&refs, row_blocks, &dev).expect("respell");
            assert_eq!(codes.dims(), [rows * n, row_blocks, 16]);
            let got = |t: &Tensor| t.flatten_all().and_then(|t| t.to_vec1::<u8>()).expect("bytes");
            assert_eq!(got(&codes), want_codes, "codes, {rows}x{row_blocks}, {n} sources");
            assert_eq!(got(&scales), want_scales, "scales, {rows}x{row_blocks}, {n} sources");
        }
    }

    /// One gpt-oss-20b layer's experts (gate, up: 32 × 2880 rows of 90 blocks; down likewise),
    /// random bytes in a mapped file as a GGUF's lie in the page cache, onto the GPU: the old way
    /// (host respelling, then the respelled copy up) against the raw upload and the kernel. Prints
    /// milliseconds per layer (×24 for the whole file); the two must give the same bytes.
    #[test]
    #[ignore = "needs a CUDA GPU: cargo test --release --lib kernels -- --ignored"]
    fn gpu_expert_respelling_timing() {
        use std::io::Write;
        use std::time::Instant;

        let dev = gpu();
        let (e, rows, rb) = (32, 2880, 90);
        let part = e * rows * rb * GGML_BLOCK_BYTES;
        let mut file = tempfile::tempfile().expect("temp file");
        let mut bytes = vec![0u8; part];
        let mut r = rng("respelling timing");
        for _ in 0..3 {
            r.fill_bytes(&mut bytes);
            file.write_all(&bytes).expect("write");
        }
        drop(bytes);
        // SAFETY: a private temporary file nobody else writes.
        let map = unsafe { memmap2::Mmap::map(&file) }.expect("map");
        let (gate, up, down) = (&map[..part], &map[part..2 * part], &map[2 * part..]);
        let layer = |gpu_side: bool| -> (Vec<Tensor>, f64) {
            dev.synchronize().expect("sync");
            let t = Instant::now();
            let ts = if gpu_side {
                let (a, b) = ggml_rows_to_hf_on(&[gate, up], rb, &dev).expect("gate_up");
                let (c, d) = ggml_rows_to_hf_on(&[down], rb, &dev).expect("down");
                vec![a, b, c, d]
            } else {
                let up_ = |v: Vec<u8>| {
                    let n = v.len();
                    Tensor::from_vec(v, n, &dev).expect("upload")
                };
                let (a, b) = mxfp4::ggml_rows_to_hf(&[gate, up], rb);
                let (c, d) = mxfp4::ggml_rows_to_hf(&[down], rb);
                vec![up_(a), up_(b), up_(c), up_(d)]
            };
            dev.synchronize().expect("sync");
            (ts, t.elapsed().as_secs_f64() * 1e3)
        };
        let _ = (layer(false), layer(true));
        let (host, host_ms) = layer(false);
        let (kernel, kernel_ms) = layer(true);
        println!(
            "one gpt-oss-20b layer's experts ({:.0} MB of ggml blocks): host respelling + upload {host_ms:.1} ms, raw upload + kernel {kernel_ms:.1} ms",
            3.0 * part as f64 / 1e6
        );
        for (h, k) in host.iter().zip(&kernel) {
            let bytes =
                |t: &Tensor| t.flatten_all().and_then(|t| t.to_vec1::<u8>()).expect("bytes");
            assert_eq!(bytes(h), bytes(k));
        }
    }
}
