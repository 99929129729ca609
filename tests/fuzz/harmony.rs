//! The harmony parser (src/chat/harmony): what a gpt-oss model samples, read as it streams.
//! Random token streams heavy in control tokens, and valid assistant turns (analysis, a tool
//! call with a constrained recipient, a final answer) with ids deleted, inserted, repeated and
//! cut. The parser may report an error; it must not panic, and each message it keeps is text.

use std::sync::OnceLock;
use std::time::Duration;

use inferno::chat::harmony::HarmonyEncoding;
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::Index;
use tokenizers::Tokenizer;

use super::run::fuzz;

fn tokenizer() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| {
        let path =
            crate::common::asset("gptoss-tokenizer.json", "scripts/assets/gptoss-tokenizer.sh");
        Tokenizer::from_file(path).unwrap()
    })
}

const TURNS: &[&str] = &[
    "<|channel|>analysis<|message|>Think: 2+2=4.<|end|><|start|>assistant<|channel|>final<|message|>4<|return|>",
    "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}<|call|>",
    " to=functions.f<|channel|>commentary json<|message|>{\"a\": [1, 2]}<|call|>",
    "<|channel|>final<|message|>é🦀 done<|return|>",
    "<|start|>assistant<|channel|>analysis<|message|>x<|end|><|start|>user<|message|>hi<|end|>",
];

/// One id of a stream: a control token, any vocabulary id, or one past the vocabulary.
#[derive(Debug, Clone)]
enum Pick {
    Control(Index),
    Vocab(u32),
}

fn stream() -> impl Strategy<Value = Vec<Pick>> {
    vec(
        prop_oneof![
            2 => any::<Index>().prop_map(Pick::Control),
            3 => (0u32..201_100).prop_map(Pick::Vocab),
            1 => any::<u32>().prop_map(Pick::Vocab),
        ],
        0..64,
    )
}

#[derive(Debug, Clone)]
enum IdEdit {
    Delete(Index),
    Insert(Index, Pick),
    Repeat(Index, Index),
    Cut(Index),
}

fn id_edit() -> impl Strategy<Value = IdEdit> {
    let pick =
        prop_oneof![any::<Index>().prop_map(Pick::Control), (0u32..201_100).prop_map(Pick::Vocab),];
    prop_oneof![
        any::<Index>().prop_map(IdEdit::Delete),
        (any::<Index>(), pick).prop_map(|(i, p)| IdEdit::Insert(i, p)),
        (any::<Index>(), any::<Index>()).prop_map(|(a, b)| IdEdit::Repeat(a, b)),
        any::<Index>().prop_map(IdEdit::Cut),
    ]
}

fn id_of(enc: &HarmonyEncoding, p: &Pick) -> u32 {
    let s = enc.ids();
    let controls = [s.start, s.end, s.message, s.channel, s.return_, s.call, s.constrain];
    match p {
        Pick::Control(i) => controls[i.index(controls.len())],
        Pick::Vocab(v) => *v,
    }
}

fn edited_turn(enc: &HarmonyEncoding, turn: &str, edits: &[IdEdit]) -> Vec<u32> {
    let mut ids = enc.tokenizer().encode(turn, false).unwrap().get_ids().to_vec();
    for e in edits {
        let n = ids.len();
        match e {
            IdEdit::Delete(i) if n > 0 => {
                ids.remove(i.index(n));
            }
            IdEdit::Insert(i, p) => ids.insert(i.index(n + 1), id_of(enc, p)),
            IdEdit::Repeat(a, b) if n > 0 => {
                let (a, b) = (a.index(n), b.index(n));
                let (from, to) = (a.min(b), a.max(b) + 1);
                let copy: Vec<u32> = ids[from..to].to_vec();
                ids.splice(to..to, copy);
            }
            IdEdit::Cut(i) => ids.truncate(i.index(n + 1)),
            _ => {}
        }
    }
    ids
}

/// Feeds `ids` to a fresh parser, then ends it; errors are fine.
fn parse(enc: &HarmonyEncoding, ids: &[u32]) {
    let mut p = enc.parser();
    for &id in ids {
        if p.push(id).is_err() {
            return;
        }
        let _ = (p.done(), p.current_channel());
    }
    let _ = p.finish();
    for m in p.into_messages() {
        let _ = format!("{m:?}");
    }
}

#[test]
#[cfg_attr(not(feature = "conformance"), ignore = "needs the gpt-oss tokenizer: scripts/test.sh")]
fn harmony_random_streams() {
    let enc = HarmonyEncoding::new(tokenizer()).unwrap();
    fuzz("harmony_random", 10000, Duration::from_secs(2), stream(), |picks| {
        let ids: Vec<u32> = picks.iter().map(|p| id_of(&enc, p)).collect();
        parse(&enc, &ids);
        Ok(())
    });
}

#[test]
#[cfg_attr(not(feature = "conformance"), ignore = "needs the gpt-oss tokenizer: scripts/test.sh")]
fn harmony_edited_turns() {
    let enc = HarmonyEncoding::new(tokenizer()).unwrap();
    let strategy = (prop::sample::select(TURNS), vec(id_edit(), 1..8));
    fuzz("harmony_edited", 10000, Duration::from_secs(2), strategy, |(turn, edits)| {
        parse(&enc, &edited_turn(&enc, turn, &edits));
        Ok(())
    });
}
