use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{ALIGN, Blocks};

/// Random allocation and free sequences over two chunks (adjacent in address, so merging across
/// the boundary would show): live blocks never overlap, stay inside one chunk and are aligned;
/// free plus live always covers the chunks exactly; once everything is freed, each chunk is one
/// free block again.
#[test]
fn blocks_never_overlap_and_free_space_returns_whole() {
    let mut rng = StdRng::seed_from_u64(0x5eed);
    for round in 0..200 {
        let mut b = Blocks::default();
        let chunks = [(1u64 << 20, 64 * ALIGN), ((1 << 20) + 64 * ALIGN, 40 * ALIGN)];
        for &(s, l) in &chunks {
            b.add_chunk(s, l);
        }
        let mut live: Vec<(u64, u64)> = Vec::new();
        for _ in 0..300 {
            if live.is_empty() || rng.random_bool(0.55) {
                let bytes = rng.random_range(0..12 * ALIGN);
                if let Some(p) = b.alloc(bytes) {
                    let len = bytes.max(1).div_ceil(ALIGN) * ALIGN;
                    assert_eq!(p % ALIGN, 0);
                    assert!(
                        chunks.iter().any(|&(s, l)| p >= s && p + len <= s + l),
                        "round {round}: block {p}+{len} crosses a chunk"
                    );
                    for &(q, ql) in &live {
                        assert!(p + len <= q || q + ql <= p, "round {round}: overlap");
                    }
                    live.push((p, len));
                } else {
                    let largest = b.free_blocks().iter().map(|f| f.1).max().unwrap_or(0);
                    assert!(largest < bytes.max(1).div_ceil(ALIGN) * ALIGN, "refused with room");
                }
            } else {
                let (p, _) = live.swap_remove(rng.random_range(0..live.len()));
                assert!(b.free(p));
                assert!(!b.free(p), "a block freed twice");
            }
            let free: u64 = b.free_blocks().iter().map(|f| f.1).sum();
            assert_eq!(free + b.live_bytes(), b.chunk_bytes());
        }
        for (p, _) in live.drain(..) {
            assert!(b.free(p));
        }
        assert_eq!(b.free_blocks(), chunks.to_vec(), "round {round}");
        // What an arena frees when its engine goes: exactly the chunks it added.
        assert_eq!(b.chunks().collect::<Vec<_>>(), chunks.to_vec(), "round {round}");
        assert_eq!(b.largest_free(), 64 * ALIGN);
    }
}

#[test]
fn foreign_addresses_are_not_freed() {
    let mut b = Blocks::default();
    b.add_chunk(4096, 4096);
    let p = b.alloc(10).unwrap();
    assert!(!b.free(p + ALIGN));
    assert!(!b.free(1));
    assert!(b.is_live(p));
    assert!(b.free(p));
    assert!(!b.is_live(p));
}

#[test]
fn best_fit_keeps_large_blocks_whole() {
    let mut b = Blocks::default();
    b.add_chunk(0, 100 * ALIGN);
    let big = b.alloc(50 * ALIGN).unwrap();
    let _wall = b.alloc(ALIGN).unwrap();
    let small = b.alloc(2 * ALIGN).unwrap();
    let _rest = b.alloc(47 * ALIGN).unwrap();
    assert_eq!(b.alloc(1), None);
    assert!(b.free(small));
    assert!(b.free(big));
    // The 2-block hole takes the small request; the 50-block hole stays whole for a large one.
    assert_eq!(b.alloc(ALIGN), Some(small));
    assert_eq!(b.alloc(50 * ALIGN), Some(big));
    assert_eq!(b.alloc(ALIGN), Some(small + ALIGN));
    assert_eq!(b.alloc(1), None);
}
