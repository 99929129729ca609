use super::sum_in_rank_order;

#[test]
fn reference_adds_in_rank_order() {
    // In f32, (1 + 1e8) - 1e8 is 0 and (-1e8 + 1e8) + 1 is 1: the order is what is checked.
    let pieces = vec![vec![1.0f32], vec![1e8], vec![-1e8]];
    assert_eq!(sum_in_rank_order(&pieces), vec![0.0]);
    let reversed: Vec<Vec<f32>> = pieces.iter().rev().cloned().collect();
    assert_eq!(sum_in_rank_order(&reversed), vec![1.0]);
    assert_eq!(sum_in_rank_order(&[]), Vec::<f32>::new());
}

#[cfg(feature = "cuda")]
mod gpu {
    use candle_core::cuda_backend::cudarc::driver::DevicePtr;
    use candle_core::{Device, Storage, Tensor};
    use rand::Rng;

    use super::super::{
        BLOCKS, MAX_RANKS, Peers, all_reduce_f32, buffer_bytes, flag_offset, region_offset,
        sum_in_rank_order,
    };
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

    /// One rank's kernel against the reference, on one GPU: the other ranks' buffers are plain
    /// allocations, and what they would have pushed into this rank's buffer (their pieces, their
    /// flags for this call) is written there before the launch. Three calls, so both slots and the
    /// call count are used; the sum must equal the reference bit for bit, and every other rank's
    /// buffer must have received this rank's piece and its flag for every block.
    #[test]
    #[ignore = "needs a CUDA GPU: cargo test --release --lib kernels -- --ignored"]
    fn gpu_one_rank_matches_reference_with_peers_standing_in() {
        let dev = gpu();
        let mut r = rng("all reduce");
        let region = 4096;
        for (world, n) in [(2, 2880), (2, 4), (3, 4096), (4, 1000), (8, 2880), (MAX_RANKS, 12)] {
            let rank = r.random_range(0..world);
            let bytes = buffer_bytes(world, region);
            for call in 1..=3u32 {
                let slot = (call & 1) as usize;
                let pieces: Vec<Vec<f32>> =
                    (0..world).map(|_| uniform(&mut r, n, -50.0, 50.0)).collect();
                // This rank's buffer as the kernel should find it: the others' pieces and flags,
                // and its own count of the calls before this one.
                let mut own = words(bytes);
                for p in (0..world).filter(|&p| p != rank) {
                    let at = region_offset(slot, world, p, region) / 4;
                    own[at..at + n].copy_from_slice(
                        &pieces[p].iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    );
                    for b in 0..BLOCKS {
                        own[flag_offset(b, p) / 4] = call;
                    }
                }
                for b in 0..BLOCKS {
                    own[BLOCKS * MAX_RANKS + b] = call - 1;
                }
                let buffers: Vec<Tensor> = (0..world)
                    .map(|p| {
                        let image = if p == rank { own.clone() } else { words(bytes) };
                        Tensor::from_vec(image, bytes / 4, &Device::Cpu)
                            .unwrap()
                            .to_device(&dev)
                            .unwrap()
                    })
                    .collect();
                let mut peers = Peers::default();
                for (p, b) in buffers.iter().enumerate() {
                    peers.base[p] = address(b);
                }
                let x = Tensor::from_vec(pieces[rank].clone(), n, &Device::Cpu)
                    .unwrap()
                    .to_device(&dev)
                    .unwrap();
                let got = values(&all_reduce_f32(&x, &peers, rank, world, region).unwrap());
                let want = sum_in_rank_order(&pieces);
                assert!(
                    got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "world {world}, rank {rank}, n {n}, call {call}: the sum differs from the reference"
                );
                for (p, b) in buffers.iter().enumerate() {
                    let image = b.to_vec1::<u32>().unwrap();
                    let at = region_offset(slot, world, rank, region) / 4;
                    let mine: Vec<u32> = pieces[rank].iter().map(|v| v.to_bits()).collect();
                    assert_eq!(
                        &image[at..at + n],
                        &mine[..],
                        "rank {p} did not get rank {rank}'s piece"
                    );
                    for blk in 0..BLOCKS {
                        assert_eq!(
                            image[flag_offset(blk, rank) / 4],
                            call,
                            "rank {p}, block {blk}: flag"
                        );
                    }
                    if p == rank {
                        assert!(
                            (0..BLOCKS).all(|blk| image[BLOCKS * MAX_RANKS + blk] == call),
                            "counts"
                        );
                    }
                }
            }
        }
    }
}
