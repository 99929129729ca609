use super::*;

#[test]
fn balanced_shares_cover_every_unit_once() {
    for world in 1..=8 {
        for n in [0, 1, 7, 8, 90, 2880] {
            let mut next = 0;
            for rank in 0..world {
                let r = Shard { rank, world }.balanced(n);
                assert_eq!(r.start, next, "n {n} world {world} rank {rank}");
                assert!(r.len() == n / world || r.len() == n / world + 1);
                next = r.end;
            }
            assert_eq!(next, n);
        }
    }
}

#[test]
fn heads_split_and_key_value_heads_replicate_past_their_count() {
    let s = |rank, world| Shard { rank, world };
    // gpt-oss: 64 query heads, 8 key/value heads.
    assert_eq!(s(1, 4).heads(64, 8).unwrap(), (16..32, 2..4));
    // Fewer key/value heads than ranks: each rank keeps the one its query heads read.
    assert_eq!(s(5, 16).heads(64, 8).unwrap(), (20..24, 2..3));
    assert_eq!(s(3, 4).heads(4, 2).unwrap(), (3..4, 1..2));
    assert!(s(0, 3).heads(64, 8).is_err());
    assert!(s(0, 4).heads(4, 3).is_err());
}

#[test]
fn vocabulary_pieces_are_equal_and_the_last_is_short() {
    let s = |rank| Shard { rank, world: 3 };
    assert_eq!(s(0).vocab(10), (0..4, 4));
    assert_eq!(s(2).vocab(10), (8..10, 4));
    assert_eq!(Shard { rank: 1, world: 2 }.vocab(201088), (100544..201088, 100544));
}

#[test]
fn mxfp4_columns_keep_whole_blocks() {
    let cols: Vec<_> =
        (0..4).map(|rank| Shard { rank, world: 4 }.blocks_of_32(2880).unwrap()).collect();
    assert_eq!(cols, [0..736, 736..1472, 1472..2176, 2176..2880]);
    assert!(Shard { rank: 0, world: 4 }.blocks_of_32(64).is_err());
}

#[test]
fn threads_gather_in_rank_order_and_sum_the_same_bits_on_every_rank() {
    use candle_core::{Device, Tensor};
    let world = 4;
    let ends = ThreadGroup::new(world);
    let results: Vec<(Vec<f32>, Vec<f32>, Vec<u32>)> = std::thread::scope(|s| {
        let handles: Vec<_> = ends
            .iter()
            .map(|c| {
                s.spawn(move || {
                    let r = c.shard().rank as f32;
                    let x = Tensor::new(&[r, 0.1 * r + 1e-7, -r], &Device::Cpu).unwrap();
                    let all = c.all_gather(&x).unwrap().flatten_all().unwrap().to_vec1().unwrap();
                    let sum = collective::all_reduce_sum(c, &x).unwrap().to_vec1().unwrap();
                    let b = Tensor::new(&[c.shard().rank as u32; 2], &Device::Cpu).unwrap();
                    c.broadcast(&b, 2).unwrap();
                    (all, sum, b.to_vec1().unwrap())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let want_sum: Vec<f32> = {
        let mut acc = [0f32; 3];
        for r in 0..world {
            let r = r as f32;
            for (a, v) in acc.iter_mut().zip([r, 0.1 * r + 1e-7, -r]) {
                *a += v;
            }
        }
        acc.to_vec()
    };
    for (rank, (all, sum, b)) in results.iter().enumerate() {
        assert_eq!(all[3 * 2], 2.0, "rank {rank}: rank 2's piece third");
        assert_eq!(sum, &want_sum, "rank {rank}");
        assert_eq!(b, &[2, 2], "rank {rank}: rank 2's broadcast");
    }
}
