//! The block manager against a simulated device pool: every slot holds the token prefix whose
//! KV it contains, so a block handed to the wrong sequence, or overwritten while another
//! sequence still reads it, shows up as a content mismatch.

use std::collections::HashMap;

use super::*;

/// SplitMix64: a tiny deterministic PRNG.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }
}

fn cfg(block_size: usize, groups: &[(usize, Option<usize>)]) -> BlockConfig {
    let groups = groups.iter().map(|&(blocks, window)| GroupSpec { blocks, window }).collect();
    BlockConfig { block_size, groups }
}

/// A live sequence of the model: all its tokens (prompt + what it will generate) and how many
/// positions are computed.
struct SimSeq {
    tokens: Vec<u32>,
    computed: usize,
}

#[derive(Default, Debug)]
struct Stats {
    reused_tokens: usize,
    no_space: usize,
    released: usize,
    finished: usize,
}

struct Sim {
    m: BlockManager,
    /// Per group, per slot: the token prefix whose KV the slot holds (tokens 0..=pos).
    pool: Vec<Vec<Option<Vec<u32>>>>,
    seqs: HashMap<SeqId, SimSeq>,
    stats: Stats,
}

impl Sim {
    fn new(c: BlockConfig) -> Sim {
        let pool = c.groups.iter().map(|g| vec![None; g.blocks * c.block_size]).collect();
        Sim {
            m: BlockManager::new(c).unwrap(),
            pool,
            seqs: HashMap::new(),
            stats: Stats::default(),
        }
    }

    fn window(&self, g: usize) -> Option<usize> {
        self.m.groups[g].window
    }

    /// Key positions the query at `pos` reads in group `g`.
    fn keys(&self, g: usize, pos: usize) -> std::ops::RangeInclusive<usize> {
        self.window(g).map_or(0, |w| (pos + 1).saturating_sub(w))..=pos
    }

    fn add(&mut self, id: SeqId, tokens: Vec<u32>, prompt: usize) {
        let n = self.m.add_sequence(id, &tokens[..prompt]);
        assert_eq!(n % self.m.block_size(), 0);
        assert!(n < prompt.max(1), "reused {n} of a {prompt}-token prompt");
        self.stats.reused_tokens += n;
        self.seqs.insert(id, SimSeq { tokens, computed: n });
    }

    /// Allocates and "computes" `len` more positions of `id`: writes the pool, checks that every
    /// key each new query reads holds this sequence's own prefix, commits.
    fn step(&mut self, id: SeqId, len: usize, release: bool) -> Result<(), KvError> {
        let s = &self.seqs[&id];
        let (start, end) = (s.computed, (s.computed + len).min(s.tokens.len()));
        let tokens = s.tokens.clone();
        self.m.ensure(id, start, end)?;
        let bs = self.m.block_size();
        for g in 0..self.pool.len() {
            for pos in start..end {
                let slot = self.m.slot(id, g, pos).expect("ensured position has a slot");
                let blk = &self.m.groups[g].blocks[slot as usize / bs];
                assert!(blk.refs == 1 && blk.hash.is_none(), "writing a shared or cached block");
                self.pool[g][slot as usize] = Some(tokens[..=pos].to_vec());
            }
            for pos in start..end {
                for key in self.keys(g, pos) {
                    let slot = self.m.slot(id, g, key).expect("visible key has a slot");
                    let held = self.pool[g][slot as usize].as_deref();
                    assert_eq!(held, Some(&tokens[..=key]), "seq {id} g{g} pos {pos} key {key}");
                }
            }
        }
        self.m.commit(id, &tokens[..end])?;
        if release {
            self.m.release_out_of_window(id, end);
        }
        self.seqs.get_mut(&id).expect("stepped sequence is live").computed = end;
        Ok(())
    }

    fn free(&mut self, id: SeqId) {
        self.m.free_sequence(id);
        self.seqs.remove(&id);
    }

    /// Every held slot of every live sequence holds that sequence's content, and every slot the
    /// next query needs is held.
    fn check(&self) {
        self.m.check_invariants().unwrap();
        for (&id, s) in &self.seqs {
            for g in 0..self.pool.len() {
                let needed = *self.keys(g, s.computed).start();
                for pos in 0..s.computed {
                    let Some(slot) = self.m.slot(id, g, pos) else {
                        assert!(pos < needed, "seq {id} g{g} lost position {pos}");
                        continue;
                    };
                    let held = self.pool[g][slot as usize].as_deref();
                    assert_eq!(held, Some(&s.tokens[..=pos]), "seq {id} g{g} pos {pos}");
                }
            }
        }
    }

    /// Frees everything: no block may leak, in use or cached.
    fn drain(&mut self) {
        let ids: Vec<SeqId> = self.seqs.keys().copied().collect();
        for id in ids {
            self.free(id);
        }
        self.check();
        for g in 0..self.pool.len() {
            assert_eq!(self.m.free_blocks(g), self.m.total_blocks(g), "group {g} leaked");
        }
        self.m.clear_cache();
        self.m.check_invariants().unwrap();
        for g in 0..self.pool.len() {
            assert_eq!(self.m.free_blocks(g), self.m.total_blocks(g));
            assert_eq!(self.m.cached_blocks(g), 0);
            assert!(self.m.groups[g].cached.is_empty());
        }
    }
}

/// A prompt drawn from a few shared prefixes, then a tail and a continuation over a tiny
/// vocabulary (so that equal blocks also arise by chance): (tokens, prompt length).
fn draw(rng: &mut Rng, bases: &[Vec<u32>]) -> (Vec<u32>, usize) {
    let base = &bases[rng.below(bases.len())];
    let mut tokens = base[..rng.below(base.len() + 1)].to_vec();
    for _ in 0..1 + rng.below(14) {
        tokens.push(rng.below(3) as u32);
    }
    let prompt = tokens.len();
    for _ in 0..rng.below(24) {
        tokens.push(rng.below(3) as u32);
    }
    (tokens, prompt)
}

fn random_run(c: BlockConfig, seed: u64, ops: usize) -> Stats {
    let mut rng = Rng(seed);
    let bases: Vec<Vec<u32>> =
        (0..3).map(|_| (0..32).map(|_| 100 + rng.below(1000) as u32).collect()).collect();
    let mut sim = Sim::new(c);
    let mut next_id: SeqId = 0;
    for _ in 0..ops {
        let live: Vec<SeqId> = {
            let mut v: Vec<SeqId> = sim.seqs.keys().copied().collect();
            v.sort_unstable();
            v
        };
        let pick = |rng: &mut Rng| live[rng.below(live.len())];
        match rng.below(100) {
            0..15 if live.len() < 8 => {
                let (tokens, prompt) = draw(&mut rng, &bases);
                sim.add(next_id, tokens, prompt);
                next_id += 1;
            }
            0..75 if !live.is_empty() => {
                let id = pick(&mut rng);
                let s = &sim.seqs[&id];
                if s.computed == s.tokens.len() {
                    sim.stats.finished += 1;
                    sim.free(id);
                } else {
                    let len = if rng.chance(50) { 1 } else { 1 + rng.below(12) };
                    let tables: Vec<Vec<u32>> = (0..sim.pool.len())
                        .flat_map(|g| live.iter().map(move |&i| (g, i)))
                        .map(|(g, i)| sim.m.table(i, g).to_vec())
                        .collect();
                    let free: Vec<usize> =
                        (0..sim.pool.len()).map(|g| sim.m.free_blocks(g)).collect();
                    match sim.step(id, len, rng.chance(70)) {
                        Ok(()) => {}
                        Err(KvError::NoSpace(_)) => {
                            sim.stats.no_space += 1;
                            let after: Vec<Vec<u32>> = (0..sim.pool.len())
                                .flat_map(|g| live.iter().map(move |&i| (g, i)))
                                .map(|(g, i)| sim.m.table(i, g).to_vec())
                                .collect();
                            assert_eq!(tables, after, "a failed ensure changed a table");
                            let free_after: Vec<usize> =
                                (0..sim.pool.len()).map(|g| sim.m.free_blocks(g)).collect();
                            assert_eq!(free, free_after, "a failed ensure changed the pools");
                            // Preempt someone (maybe the same sequence).
                            let victim = pick(&mut rng);
                            sim.free(victim);
                        }
                        Err(e) => panic!("{e}"),
                    }
                }
            }
            0..90 if !live.is_empty() => sim.free(pick(&mut rng)),
            0..92 => sim.m.clear_cache(),
            _ if !live.is_empty() => {
                let id = pick(&mut rng);
                let before = sim.m.free_blocks(sim.pool.len() - 1);
                sim.m.release_out_of_window(id, sim.seqs[&id].computed);
                sim.stats.released += sim.m.free_blocks(sim.pool.len() - 1) - before;
            }
            _ => {}
        }
        sim.check();
    }
    sim.drain();
    sim.stats
}

#[test]
fn random_ops_never_hand_out_wrong_or_live_content() {
    let configs = [
        // gpt-oss-like: full + sliding, window not a multiple of the block size.
        cfg(4, &[(40, None), (16, Some(6))]),
        cfg(4, &[(60, None), (12, Some(8))]),
        // Llama-like: one full group.
        cfg(4, &[(30, None)]),
        // Sliding only, tiny blocks.
        cfg(2, &[(24, Some(5))]),
    ];
    for (i, c) in configs.into_iter().enumerate() {
        for seed in 0..3 {
            let stats = random_run(c.clone(), 1000 * i as u64 + seed, 3000);
            // The run must have exercised sharing and running out of space.
            assert!(stats.reused_tokens > 0 && stats.no_space > 0, "{c:?} {stats:?}");
            assert!(stats.finished > 0, "{c:?} {stats:?}");
            if c.groups.last().is_some_and(|g| g.window.is_some()) {
                assert!(stats.released > 0, "{c:?} {stats:?}");
            }
        }
    }
}

#[test]
fn many_sequences_freed_leak_nothing() {
    for seed in 0..5 {
        random_run(cfg(4, &[(200, None), (80, Some(7))]), 77 + seed, 1500);
    }
}

/// A prompt of distinct tokens: `base + i`.
fn distinct(base: u32, len: usize) -> Vec<u32> {
    (0..len as u32).map(|i| base + i).collect()
}

/// Runs `tokens` of `id` (already added with nothing reused) and commits.
fn compute(m: &mut BlockManager, id: SeqId, tokens: &[u32]) {
    m.ensure(id, 0, tokens.len()).unwrap();
    m.commit(id, tokens).unwrap();
}

#[test]
fn sliding_release_gives_blocks_back_and_hits_need_the_window() {
    // bs 4, W 8: full group with room to spare, sliding group of exactly 10 blocks.
    let mut m = BlockManager::new(cfg(4, &[(41, None), (11, Some(8))])).unwrap();
    let a = distinct(100, 40);
    assert_eq!(m.add_sequence(1, &a), 0);
    compute(&mut m, 1, &a);
    assert_eq!(m.free_blocks(1), 0);
    // Next query at 40 sees 33..=40: blocks 0..8 (positions < 32) go back, as cache.
    m.release_out_of_window(1, 40);
    assert_eq!((m.free_blocks(1), m.cached_blocks(1)), (8, 8));
    assert!(m.table(1, 1)[..8].iter().all(|&b| b == INVALID));
    assert!(m.table(1, 1)[8..].iter().all(|&b| b != INVALID));
    assert!(m.table(1, 0).iter().all(|&b| b != INVALID));
    m.check_invariants().unwrap();
    m.free_sequence(1);
    assert_eq!(m.cached_blocks(1), 10);

    // Another sequence takes 2 sliding blocks: the LRU evicts A's blocks 7 and 6 (released
    // first, later blocks first). The full group still has free blocks and evicts nothing.
    let d = distinct(5000, 9);
    assert_eq!(m.add_sequence(2, &d), 0);
    m.ensure(2, 0, 8).unwrap();
    assert_eq!(m.cached_blocks(0), 10);
    // 30 tokens: 7 full blocks are cached in the full group, but n = 7 needs sliding blocks 5
    // and 6 (positions 21..28); n = 6 needs blocks 4 and 5 (17..24), which are still there.
    assert_eq!(m.add_sequence(3, &a[..30]), 24);
    assert_eq!(&m.table(3, 1)[..4], &[INVALID; 4]);
    assert!(m.table(3, 1)[4..6].iter().all(|&b| b != INVALID));
    m.check_invariants().unwrap();
    m.free_sequence(3);
    m.free_sequence(2);

    // Evict every sliding block: the full group alone cannot give a hit.
    let d2 = distinct(9000, 41);
    assert_eq!(m.add_sequence(4, &d2), 0);
    m.ensure(4, 0, 40).unwrap();
    assert_eq!(m.cached_blocks(0), 10);
    assert_eq!(m.add_sequence(5, &a), 0);
    m.check_invariants().unwrap();
}

#[test]
fn decoding_in_a_small_sliding_pool_needs_release() {
    let c = cfg(4, &[(64, None), (5, Some(8))]);
    for release in [true, false] {
        let mut m = BlockManager::new(c.clone()).unwrap();
        let t = distinct(7, 200);
        m.add_sequence(1, &t[..1]);
        let mut failed = None;
        for pos in 0..200 {
            if let Err(e) = m.ensure(1, pos, pos + 1) {
                failed = Some((pos, e));
                break;
            }
            m.commit(1, &t[..=pos]).unwrap();
            if release {
                m.release_out_of_window(1, pos + 1);
            }
            m.check_invariants().unwrap();
        }
        if release {
            // Positions 0..200 take 50 full blocks, and at most 3 sliding blocks at a time.
            assert_eq!(failed, None);
            assert_eq!(m.free_blocks(0), 63 - 50);
            assert!(m.table(1, 1).iter().filter(|&&b| b != INVALID).count() <= 3);
        } else {
            let e = NoSpace { group: 1, needed: 1, free: 0 }.into();
            assert_eq!(failed, Some((16, e)));
        }
    }
}

#[test]
fn ensure_is_all_or_nothing() {
    let mut m = BlockManager::new(cfg(4, &[(9, None), (3, Some(8))])).unwrap();
    m.add_sequence(1, &[1, 2, 3]);
    let err = m.ensure(1, 0, 16).unwrap_err();
    assert_eq!(err, NoSpace { group: 1, needed: 4, free: 2 }.into());
    assert_eq!((m.free_blocks(0), m.free_blocks(1)), (8, 2));
    assert!(m.table(1, 0).is_empty() && m.table(1, 1).is_empty());
    assert_eq!(m.blocks_needed(1, 0, 16), vec![4, 4]);
    m.ensure(1, 0, 8).unwrap();
    // The full group fails now, and the sliding one must not have been touched.
    m.add_sequence(2, &[1]);
    assert_eq!(m.ensure(2, 0, 28).unwrap_err(), NoSpace { group: 0, needed: 7, free: 6 }.into());
    assert_eq!((m.free_blocks(0), m.free_blocks(1)), (6, 0));
    assert!(m.table(2, 0).is_empty() && m.table(2, 1).is_empty());
    m.check_invariants().unwrap();
    assert_eq!(m.ensure(9, 0, 1), Err(KvError::UnknownSequence(9)));
}

#[test]
fn shared_prefix_blocks_are_counted_and_read_only() {
    let mut m = BlockManager::new(cfg(4, &[(20, None)])).unwrap();
    let t = distinct(1, 17);
    assert_eq!(m.add_sequence(1, &t), 0);
    compute(&mut m, 1, &t);
    // The last token always runs: 16 of 17 are reused, 12 of 16.
    assert_eq!(m.add_sequence(2, &t), 16);
    assert_eq!(m.add_sequence(3, &t[..16]), 12);
    assert_eq!(m.table(2, 0), &m.table(1, 0)[..4]);
    assert_eq!(m.groups[0].blocks[m.table(1, 0)[0] as usize].refs, 3);
    assert!(matches!(m.ensure(2, 8, 17), Err(KvError::ReadOnly { index: 2, .. })));
    m.ensure(2, 16, 17).unwrap();
    assert_ne!(m.table(2, 0)[4], m.table(1, 0)[4]);
    // A different token in block 1 shares only block 0.
    let mut u = t.clone();
    u[5] = 999;
    assert_eq!(m.add_sequence(4, &u), 4);
    m.check_invariants().unwrap();
    for id in 1..=4 {
        m.free_sequence(id);
    }
    assert_eq!(m.free_blocks(0), m.total_blocks(0));
    assert_eq!(m.cached_blocks(0), 4);
}

#[test]
fn identical_sequences_computed_together_register_once() {
    let mut m = BlockManager::new(cfg(4, &[(20, None), (20, Some(6))])).unwrap();
    let t = distinct(1, 12);
    for id in [1, 2] {
        assert_eq!(m.add_sequence(id, &t), 0);
    }
    for id in [1, 2] {
        compute(&mut m, id, &t);
    }
    m.check_invariants().unwrap();
    m.free_sequence(1);
    m.free_sequence(2);
    // Three full blocks, one copy each cached; the duplicates went back as plain free blocks.
    assert_eq!((m.cached_blocks(0), m.cached_blocks(1)), (3, 3));
    assert_eq!(m.add_sequence(3, &t), 8);
    m.check_invariants().unwrap();
}

#[test]
fn config_is_checked() {
    assert!(BlockManager::new(cfg(0, &[(4, None)])).is_err());
    assert!(BlockManager::new(cfg(4, &[(0, None)])).is_err());
    assert!(BlockManager::new(cfg(4, &[(4, Some(0))])).is_err());
    assert!(BlockManager::new(cfg(16, &[(usize::MAX / 8, None)])).is_err());
    let m = BlockManager::new(cfg(16, &[(1, None)])).unwrap();
    assert_eq!((m.total_blocks(0), m.free_blocks(0), m.total_blocks(1)), (0, 0, 0));
}
