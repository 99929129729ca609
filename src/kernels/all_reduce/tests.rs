use super::{next_call, sum_in_rank_order};

#[test]
fn reference_adds_in_rank_order() {
    // In f32, (1 + 1e8) - 1e8 is 0 and (-1e8 + 1e8) + 1 is 1: the order is what is checked.
    let pieces = vec![vec![1.0f32], vec![1e8], vec![-1e8]];
    assert_eq!(sum_in_rank_order(&pieces), vec![0.0]);
    let reversed: Vec<Vec<f32>> = pieces.iter().rev().cloned().collect();
    assert_eq!(sum_in_rank_order(&reversed), vec![1.0]);
    assert_eq!(sum_in_rank_order(&[]), Vec::<f32>::new());
}

/// The calls' numbers never take 0 (a zeroed line's) and cycle evenly, so the slots alternate
/// across the wrap.
#[test]
fn call_numbers_skip_zero_and_alternate_slots() {
    let mut last = u32::MAX - 4;
    for _ in 0..8 {
        let next = next_call(last);
        assert_ne!(next, 0);
        assert_ne!(next & 1, last & 1, "{last} → {next}");
        last = next;
    }
    assert_eq!(next_call(0), 1);
    assert_eq!(next_call(u32::MAX - 1), 1);
}

#[cfg(feature = "cuda")]
mod gpu {
    use candle_core::cuda_backend::cudarc::driver::DevicePtr;
    use candle_core::{Device, Storage, Tensor};
    use rand::Rng;

    use super::super::{
        LL_FLOATS, MAX_BLOCKS, MAX_RANKS, Peers, all_gather_b32, all_reduce_add_rms_norm,
        all_reduce_f32, broadcast_b32, buffer_bytes, flag_offset, in_lines, ll_offset, ll_words,
        next_call, region_offset, sum_in_rank_order,
    };
    use crate::kernels::layer_norm_act::AddNorm;
    use crate::kernels::testing::{gpu, rng, uniform, values};

    /// The device address of a u32 tensor's first element.
    fn address(t: &Tensor) -> u64 {
        let (s, l) = t.storage_and_layout();
        let Storage::Cuda(c) = &*s else { panic!("not a CUDA tensor") };
        let stream = c.device.cuda_stream();
        c.as_cuda_slice::<u32>().unwrap().device_ptr(&stream).0 + 4 * l.start_offset() as u64
    }

    fn words(bytes: usize) -> Vec<u32> {
        vec![0; bytes / 4]
    }

    /// The ranks' buffers on one GPU as rank `rank`'s kernel should find them at the call after
    /// call `last`: in its own, the other ranks' pieces as they push them for that call (LL
    /// lines, or plain floats and their flags) and its count of the calls before; the others'
    /// zeroed. Also the `Peers` addressing them.
    fn stand_in(
        dev: &Device,
        pieces: &[Vec<f32>],
        rank: usize,
        region: usize,
        last: u32,
    ) -> (Vec<Tensor>, Peers) {
        let world = pieces.len();
        let bytes = buffer_bytes(world, region);
        let call = next_call(last);
        let slot = (call & 1) as usize;
        let mut own = words(bytes);
        for p in (0..world).filter(|&p| p != rank) {
            let (at, image) = if in_lines(pieces[p].len()) {
                (ll_offset(slot, world, p, region) / 4, ll_words(&pieces[p], call))
            } else {
                for b in 0..MAX_BLOCKS {
                    own[flag_offset(b, p) / 4] = call;
                }
                let bits = pieces[p].iter().map(|v| v.to_bits()).collect();
                (region_offset(slot, world, p, region) / 4, bits)
            };
            own[at..at + image.len()].copy_from_slice(&image);
        }
        for b in 0..MAX_BLOCKS {
            own[MAX_BLOCKS * MAX_RANKS + b] = last;
        }
        let buffers: Vec<Tensor> = (0..world)
            .map(|p| {
                let image = if p == rank { own.clone() } else { words(bytes) };
                Tensor::from_vec(image, bytes / 4, &Device::Cpu).unwrap().to_device(dev).unwrap()
            })
            .collect();
        let mut peers = Peers::default();
        for (p, b) in buffers.iter().enumerate() {
            peers.base[p] = address(b);
        }
        (buffers, peers)
    }

    /// Checks that every other rank's buffer received `piece` from `rank` for call `call` as the
    /// kernel pushes it (LL lines, or plain floats and a flag per block), and that `rank`'s own
    /// count moved to the call.
    fn pushed(
        buffers: &[Tensor],
        piece: &[f32],
        rank: usize,
        region: usize,
        call: u32,
        what: &str,
    ) {
        let world = buffers.len();
        let slot = (call & 1) as usize;
        for (p, b) in buffers.iter().enumerate() {
            let image = b.to_vec1::<u32>().unwrap();
            if p == rank {
                let counts = &image[MAX_BLOCKS * MAX_RANKS..MAX_BLOCKS * (MAX_RANKS + 1)];
                assert!(counts.iter().all(|&c| c == call), "{what}: counts {counts:?}");
                continue;
            }
            let (at, want) = if in_lines(piece.len()) {
                (ll_offset(slot, world, rank, region) / 4, ll_words(piece, call))
            } else {
                for blk in 0..MAX_BLOCKS {
                    assert_eq!(image[flag_offset(blk, rank) / 4], call, "{what}: rank {p}'s flag");
                }
                (
                    region_offset(slot, world, rank, region) / 4,
                    piece.iter().map(|v| v.to_bits()).collect(),
                )
            };
            assert!(
                image[at..at + want.len()] == want[..],
                "{what}: rank {p} did not get the piece"
            );
        }
    }

    fn bits(t: &Tensor) -> Vec<u32> {
        values(t).iter().map(|v| v.to_bits()).collect()
    }

    /// The sum fused with the residual add and norm gives the bits of the two launches it
    /// replaces (the sum, then `add_rms_norm`), for one row, for fewer rows than blocks (20 ×
    /// 2,880, in LL lines), for rows a block each (its grid grows with them: 64 × 2,880, past the
    /// lines) and for more rows than its largest grid (each block then norms two), with and
    /// without a bias and the f32 norm, across the calls' wrap; and it pushes its piece as the
    /// plain sum does.
    #[test]
    #[ignore = "needs a CUDA GPU: cargo test --release --lib kernels -- --ignored"]
    fn gpu_sum_fused_with_the_norm_gives_the_two_launches_bits() {
        let dev = gpu();
        let mut r = rng("all reduce add norm");
        let region = 64 * 4096;
        for (world, rows, n) in [
            (2, 1, 2880),
            (2, 20, 2880),
            (2, 64, 2880),
            (3, 5, 64),
            (3, 200, 64),
            (4, 2, 4096),
            (2, 3, 8192),
        ] {
            let rank = r.random_range(0..world);
            for (last, with_bias, keep_f32) in
                [(0, true, true), (1, false, false), (2, true, false), (u32::MAX - 1, true, true)]
            {
                let call = next_call(last);
                let pieces: Vec<Vec<f32>> =
                    (0..world).map(|_| uniform(&mut r, rows * n, -2.0, 2.0)).collect();
                let t = |v: Vec<f32>, dims: &[usize]| {
                    Tensor::from_vec(v, dims, &Device::Cpu).unwrap().to_device(&dev).unwrap()
                };
                let x = t(uniform(&mut r, rows * n, -4.0, 4.0), &[rows, n]);
                let w = t(uniform(&mut r, n, 0.5, 1.5), &[n]);
                let bias = with_bias.then(|| t(uniform(&mut r, n, -0.5, 0.5), &[n]));
                let norm = AddNorm {
                    x: &x,
                    bias: bias.as_ref(),
                    w: &w,
                    eps: 1e-5,
                    dtype: candle_core::DType::BF16,
                    keep_f32,
                };
                let mine = t(pieces[rank].clone(), &[rows, n]);
                let what = format!("world {world}, rank {rank}, {rows} × {n}, call {call}");
                let (buffers, peers) = stand_in(&dev, &pieces, rank, region, last);
                let fused = all_reduce_add_rms_norm(&mine, &norm, &peers, rank, world, region)
                    .unwrap()
                    .expect("the fused kernel takes these");
                let (_apart, peers) = stand_in(&dev, &pieces, rank, region, last);
                let sum = all_reduce_f32(&mine, &peers, rank, world, region).unwrap();
                let want = norm.apply(&sum).unwrap();
                assert_eq!(bits(&fused.x), bits(&want.x), "{what}: the residual");
                assert_eq!(bits(&fused.h), bits(&want.h), "{what}: the bf16 norm");
                assert_eq!(fused.h32.is_some(), keep_f32, "{what}: the f32 norm asked for");
                if let (Some(a), Some(b)) = (&fused.h32, &want.h32) {
                    assert_eq!(bits(a), bits(b), "{what}: the f32 norm");
                }
                let sum_ref = sum_in_rank_order(&pieces);
                assert_eq!(values(&sum), sum_ref, "{what}: the plain sum");
                pushed(&buffers, &pieces[rank], rank, region, call, &what);
            }
        }
    }

    /// `buffers` with rank `rank`'s replaced by a new one holding `image`, and the `Peers`
    /// addressing them.
    fn with_own(dev: &Device, buffers: &[Tensor], rank: usize, image: Vec<u32>) -> (Tensor, Peers) {
        let len = image.len();
        let own = Tensor::from_vec(image, len, &Device::Cpu).unwrap().to_device(dev).unwrap();
        let mut peers = Peers::default();
        for (p, b) in buffers.iter().enumerate() {
            peers.base[p] = address(if p == rank { &own } else { b });
        }
        (own, peers)
    }

    /// A plain call takes a peer's flags a few calls ahead (a rank that went on), and waits for
    /// flags behind the call however far behind: flags move only in plain calls, and ones
    /// 2^31 + 5 calls old must not read as ahead (the kernel would add a piece that has not
    /// landed). There the piece, then the flags, land from another stream while the kernel
    /// waits; with the flags taken early the sum would miss the piece.
    #[test]
    #[ignore = "needs a CUDA GPU: cargo test --release --lib kernels -- --ignored"]
    fn gpu_plain_call_takes_flags_ahead_and_waits_for_stale_ones() {
        use candle_core::cuda_backend::cudarc::driver::sys;
        let dev = gpu();
        let Device::Cuda(cuda) = &dev else { unreachable!("gpu() is a CUDA device") };
        let mut r = rng("stale flags");
        let (world, rank, region) = (2, 0, 2 * LL_FLOATS);
        let n = LL_FLOATS + 4;
        assert!(!in_lines(n));
        let call = next_call(41);
        let pieces: Vec<Vec<f32>> = (0..world).map(|_| uniform(&mut r, n, -50.0, 50.0)).collect();
        let want: Vec<u32> = sum_in_rank_order(&pieces).iter().map(|v| v.to_bits()).collect();
        let x = Tensor::from_vec(pieces[rank].clone(), n, &Device::Cpu).unwrap();
        let x = x.to_device(&dev).unwrap();
        let (buffers, _) = stand_in(&dev, &pieces, rank, region, 41);
        let image = buffers[rank].to_vec1::<u32>().unwrap();
        let with_flags = |mut image: Vec<u32>, value: u32| {
            for b in 0..MAX_BLOCKS {
                image[flag_offset(b, 1) / 4] = value;
            }
            image
        };

        let (_own, peers) = with_own(&dev, &buffers, rank, with_flags(image.clone(), call + 3));
        let sum = all_reduce_f32(&x, &peers, rank, world, region).unwrap();
        assert!(bits(&sum) == want, "flags three calls ahead");

        let piece_at = region_offset((call & 1) as usize, world, 1, region);
        let mut stale = with_flags(image.clone(), call.wrapping_sub((1 << 31) + 5));
        stale[piece_at / 4..piece_at / 4 + n].fill(0);
        let (own, peers) = with_own(&dev, &buffers, rank, stale);
        let base = address(&own);
        // Before the launch: a context's first second stream synchronizes it, which would wait
        // for the kernel that waits for this stream's copies.
        cuda.cuda_stream().context().bind_to_thread().unwrap();
        let other = cuda.cuda_stream().context().new_stream().unwrap();
        let sum = all_reduce_f32(&x, &peers, rank, world, region).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        let piece = &image[piece_at / 4..piece_at / 4 + n];
        let flag = [call];
        let copy = |to: usize, from: &[u32]| {
            // SAFETY: `to` lies inside `own`'s allocation with room for `from`; the host words
            // outlive the copy (the stream is synchronized below, before they go).
            let r = unsafe {
                sys::cuMemcpyHtoDAsync_v2(
                    base + to as u64,
                    from.as_ptr().cast(),
                    4 * from.len(),
                    other.cu_stream(),
                )
            };
            assert_eq!(r, sys::CUresult::CUDA_SUCCESS, "copy to the stand-in buffer");
        };
        copy(piece_at, piece);
        for b in 0..MAX_BLOCKS {
            copy(flag_offset(b, 1), &flag);
        }
        other.synchronize().unwrap();
        assert!(bits(&sum) == want, "flags 2^31 + 5 calls old: the sum took the piece early");
    }

    /// One rank's kernel against the reference, on one GPU: the other ranks' buffers are plain
    /// allocations, and what they would have pushed into this rank's buffer (their pieces, as LL
    /// lines or as plain floats and flags) is written there before the launch. Three calls, so
    /// both slots and the call count are used, and one across the count's wrap; vectors in lines
    /// and past them. The sum must equal the reference bit for bit, and every other rank's buffer
    /// must have received this rank's piece for the call.
    #[test]
    #[ignore = "needs a CUDA GPU: cargo test --release --lib kernels -- --ignored"]
    fn gpu_one_rank_matches_reference_with_peers_standing_in() {
        let dev = gpu();
        let mut r = rng("all reduce");
        let region = 2 * LL_FLOATS;
        let past = LL_FLOATS + 4;
        let cases =
            [(2, 2880), (2, 4), (3, 4096), (4, 1000), (8, 2880), (MAX_RANKS, 12), (2, past)];
        for (world, n) in cases.into_iter().chain([(4, LL_FLOATS), (3, region)]) {
            let rank = r.random_range(0..world);
            for last in [0, 1, 2, u32::MAX - 1] {
                let call = next_call(last);
                let pieces: Vec<Vec<f32>> =
                    (0..world).map(|_| uniform(&mut r, n, -50.0, 50.0)).collect();
                let (buffers, peers) = stand_in(&dev, &pieces, rank, region, last);
                let x = Tensor::from_vec(pieces[rank].clone(), n, &Device::Cpu)
                    .unwrap()
                    .to_device(&dev)
                    .unwrap();
                let got = values(&all_reduce_f32(&x, &peers, rank, world, region).unwrap());
                let want = sum_in_rank_order(&pieces);
                let what = format!("world {world}, rank {rank}, n {n}, call {call}");
                assert!(
                    got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{what}: the sum differs from the reference"
                );
                pushed(&buffers, &pieces[rank], rank, region, call, &what);
            }
        }
    }

    /// The gather and the broadcast, one rank on one GPU with the others standing in as for the
    /// sum: every rank's words in rank order (f32, and u32 as the step's token ids travel), or
    /// the root's over this rank's in place, in lines and past them, across the count's wrap; and
    /// this rank's words pushed to every other rank as the sum pushes them.
    #[test]
    #[ignore = "needs a CUDA GPU: cargo test --release --lib kernels -- --ignored"]
    fn gpu_gather_and_broadcast_with_peers_standing_in() {
        let dev = gpu();
        let mut r = rng("all gather");
        let region = 2 * LL_FLOATS;
        for (world, n) in [(2, 1), (2, 7), (3, 2880), (4, LL_FLOATS), (2, LL_FLOATS + 3), (8, 5)] {
            let rank = r.random_range(0..world);
            for (last, words) in [(0, false), (1, true), (u32::MAX - 1, false)] {
                let call = next_call(last);
                let pieces: Vec<Vec<f32>> =
                    (0..world).map(|_| uniform(&mut r, n, -50.0, 50.0)).collect();
                let mine = Tensor::from_vec(pieces[rank].clone(), n, &Device::Cpu).unwrap();
                let mine = if words {
                    let ids: Vec<u32> = pieces[rank].iter().map(|v| v.to_bits()).collect();
                    Tensor::from_vec(ids, n, &Device::Cpu).unwrap()
                } else {
                    mine
                };
                let x = mine.to_device(&dev).unwrap();
                let what = format!("world {world}, rank {rank}, n {n}, call {call}, u32 {words}");
                let (buffers, peers) = stand_in(&dev, &pieces, rank, region, last);
                let all = all_gather_b32(&x, &peers, rank, world, region).unwrap().expect("taken");
                assert_eq!(all.dims(), [world, n], "{what}");
                let got: Vec<u32> = if words {
                    all.flatten_all().unwrap().to_vec1::<u32>().unwrap()
                } else {
                    bits(&all.flatten_all().unwrap())
                };
                let want: Vec<u32> = pieces.iter().flatten().map(|v| v.to_bits()).collect();
                assert!(got == want, "{what}: the gather");
                pushed(&buffers, &pieces[rank], rank, region, call, &what);

                let root = r.random_range(0..world);
                let (buffers, peers) = stand_in(&dev, &pieces, rank, region, last);
                let y = mine.to_device(&dev).unwrap();
                assert!(broadcast_b32(&y, &peers, rank, world, region, root).unwrap());
                let got: Vec<u32> = if words { y.to_vec1::<u32>().unwrap() } else { bits(&y) };
                let want: Vec<u32> = pieces[root].iter().map(|v| v.to_bits()).collect();
                assert!(got == want, "{what}: rank {root}'s broadcast");
                pushed(&buffers, &pieces[rank], rank, region, call, &what);
            }
        }
    }
}
