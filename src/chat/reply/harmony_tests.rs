//! A gpt-oss reply that slips out of harmony still completes as what it was meant to be
//! (text, or the tool call), never an error, never markup in content, reasoning or a tool
//! name: the slips the peers' parsers failed on, then random and mutated token streams.
//! The fuzz is replayable: `INFERNO_FUZZ_SEED` picks the seed (printed on failure) and
//! `INFERNO_FUZZ_ITERS` the number of streams (CI runs the default).

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;
use crate::chat::harmony::HarmonyEncoding;
use crate::generate::StopReason;
use crate::test_assets::tokenizer;

fn enc() -> HarmonyEncoding<'static> {
    HarmonyEncoding::new(tokenizer("gptoss-tokenizer.json")).expect("gpt-oss tokenizer")
}

fn ids(text: &str) -> Vec<u32> {
    tokenizer("gptoss-tokenizer.json").encode(text, false).unwrap().get_ids().to_vec()
}

/// What a client sees of a reply: (content, reasoning, calls as (name, arguments), finish).
#[derive(Debug, Default)]
struct Seen {
    content: String,
    reasoning: String,
    calls: Vec<(String, String)>,
    finish: Option<FinishReason>,
}

/// Feeds `ids` as the engine would (stopping where the reader says), then ends with `engine`.
fn run(ids: &[u32], engine: StopReason) -> anyhow::Result<Seen> {
    let mut out = Harmony::new(enc(), Vec::new());
    let mut seen = Seen::default();
    let mut deltas = Vec::new();
    let mut ours = None;
    for &id in ids {
        let (d, stop) = out.push(id, None)?;
        deltas.extend(d);
        if stop.is_some() {
            ours = stop;
            break;
        }
    }
    let (tail, finish) = out.finish(&engine, ours.as_ref())?;
    deltas.extend(tail);
    for d in deltas {
        match d {
            Delta::Content(t) => seen.content.push_str(&t),
            Delta::Reasoning(t) => seen.reasoning.push_str(&t),
            Delta::ToolStart { index, name, .. } => {
                assert_eq!(index, seen.calls.len(), "call indexes in order");
                seen.calls.push((name, String::new()));
            }
            Delta::ToolArgs { index, text } => seen.calls[index].1.push_str(&text),
            Delta::Logprobs(_) => {}
        }
    }
    seen.finish = Some(finish);
    Ok(seen)
}

fn reply(text: &str) -> Seen {
    run(&ids(text), StopReason::MaxTokens).unwrap()
}

#[test]
#[cfg_attr(not(feature = "conformance"), ignore = "needs the gpt-oss tokenizer: scripts/test.sh")]
fn a_call_on_the_analysis_channel_is_still_a_call() {
    let s = reply(
        "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>analysis to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}<|call|>",
    );
    assert_eq!(s.calls, [("get_weather".into(), "{\"city\":\"Paris\"}".into())], "{s:?}");
    assert_eq!(s.reasoning, "Need weather.");
    assert_eq!(s.finish, Some(FinishReason::ToolCalls));
}

#[test]
#[cfg_attr(not(feature = "conformance"), ignore = "needs the gpt-oss tokenizer: scripts/test.sh")]
fn markup_never_reaches_a_tool_name() {
    for header in [
        "<|channel|>commentary to=functions.get_weather<|channel|>commentary<|message|>",
        "<|channel|>commentary to=functions.get_weather<|reserved_200017|> <|constrain|>json<|message|>",
        " to=functions.get_weather<|channel|>commentary<|constrain|>json<|message|>",
    ] {
        let s = reply(&format!("{header}{{}}<|call|>"));
        assert_eq!(s.calls, [("get_weather".into(), "{}".into())], "{header}: {s:?}");
        assert_eq!(s.finish, Some(FinishReason::ToolCalls), "{header}");
    }
}

#[test]
#[cfg_attr(not(feature = "conformance"), ignore = "needs the gpt-oss tokenizer: scripts/test.sh")]
fn malformed_headers_and_unknown_channels_become_the_answer() {
    for (text, want) in [
        ("<|channel|>final<|channel|>final<|message|>Hi there<|return|>", "Hi there"),
        ("<|channel|>finale<|message|>Hi there<|return|>", "Hi there"),
        ("<|channel|>final Hi there<|end|>", "Hi there"),
        ("Hi there<|return|>", "Hi there"),
        ("<|message|>Hi there<|return|>", "Hi there"),
    ] {
        let s = reply(text);
        assert_eq!(s.content, want, "{text}: {s:?}");
        assert!(s.calls.is_empty(), "{text}: {s:?}");
    }
}

#[test]
#[cfg_attr(not(feature = "conformance"), ignore = "needs the gpt-oss tokenizer: scripts/test.sh")]
fn an_unterminated_message_ends_the_turn_with_its_text() {
    let s = reply(
        "<|channel|>analysis<|message|>Think<|end|><|start|>assistant<|channel|>final<|message|>Hello wor",
    );
    assert_eq!((s.reasoning.as_str(), s.content.as_str()), ("Think", "Hello wor"));
    assert_eq!(s.finish, Some(FinishReason::Length));
    // A call cut short still closes with parseable arguments.
    let s = reply("<|channel|>commentary to=functions.f<|message|>");
    assert_eq!(s.calls, [("f".into(), "{}".into())], "{s:?}");
}

/// Ids of harmony's special tokens, a few reserved ones, and ordinary words.
struct Alphabet {
    special: Vec<u32>,
    words: Vec<u32>,
}

impl Alphabet {
    fn new() -> Self {
        let e = enc();
        let i = e.ids();
        let mut special =
            vec![i.start, i.end, i.message, i.channel, i.return_, i.call, i.constrain];
        special.extend([200000, 200001, 200004, 200009, 200010, 200011, 200013, 200017, 200018]);
        let words = ids(
            " analysis final commentary to= functions. get_weather assistant user json {\"a\": 1} \
             Paris hello = . to functions tool < | > |> <| 😀 the a",
        );
        Alphabet { special, words }
    }

    fn any(&self, rng: &mut StdRng) -> u32 {
        if rng.random_bool(0.35) {
            self.special[rng.random_range(0..self.special.len())]
        } else {
            self.words[rng.random_range(0..self.words.len())]
        }
    }
}

/// What no client may ever see: a special token's text, an invalid tool name, unparsed
/// arguments of a closed call left empty.
fn check(seen: &Seen, specials: &[String], what: &str) {
    for text in [&seen.content, &seen.reasoning] {
        for m in specials {
            assert!(!text.contains(m.as_str()), "{what}: {m} leaked into {text:?}");
        }
    }
    for (name, args) in &seen.calls {
        assert!(valid_name(name), "{what}: tool name {name:?}");
        assert!(!args.is_empty(), "{what}: a call without arguments text");
        for m in specials {
            assert!(!args.contains(m.as_str()), "{what}: {m} leaked into arguments {args:?}");
        }
    }
}

#[test]
#[cfg_attr(not(feature = "conformance"), ignore = "needs the gpt-oss tokenizer: scripts/test.sh")]
fn random_and_mutated_streams_never_fail_or_leak_markup() {
    let seed = crate::switches::test_var("INFERNO_FUZZ_SEED")
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random::<u64>);
    let iters: usize = crate::switches::test_var("INFERNO_FUZZ_ITERS")
        .and_then(|s| s.parse().ok())
        .unwrap_or(3000);
    let mut rng = StdRng::seed_from_u64(seed);
    let alphabet = Alphabet::new();
    let tok = tokenizer("gptoss-tokenizer.json");
    let specials: Vec<String> =
        alphabet.special.iter().map(|&id| tok.decode(&[id], false).unwrap()).collect();
    let valid = [
        "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>Answer.<|return|>",
        "<|channel|>analysis<|message|>Use a tool.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}<|call|>",
        "<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant to=functions.f<|channel|>commentary json<|message|>{}<|call|>",
    ]
    .map(ids);
    for n in 0..iters {
        let stream: Vec<u32> = if n % 2 == 0 {
            (0..rng.random_range(0..40)).map(|_| alphabet.any(&mut rng)).collect()
        } else {
            let mut s = valid[rng.random_range(0..valid.len())].clone();
            for _ in 0..rng.random_range(1..6) {
                let at = rng.random_range(0..=s.len());
                match rng.random_range(0..3) {
                    0 => s.insert(at, alphabet.any(&mut rng)),
                    1 if at < s.len() => {
                        s.remove(at);
                    }
                    _ if at < s.len() => s[at] = alphabet.any(&mut rng),
                    _ => {}
                }
            }
            s
        };
        let what = format!("seed {seed}, stream {n}: {stream:?}");
        let engine = if rng.random_bool(0.5) { StopReason::MaxTokens } else { StopReason::Eos(0) };
        let seen = run(&stream, engine).unwrap_or_else(|e| panic!("{what}: failed: {e:#}"));
        check(&seen, &specials, &what);
    }
}
