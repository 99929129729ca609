use super::SavedChat;
use crate::chat::harmony::{Channel, HarmonyChat, ReasoningEffort, Role, SystemConfig};
use crate::chat::{Conversation, Dialogue};
use crate::error::{ErrorKind, kind_of};
use crate::generate::SamplerConfig;

fn sampler() -> SamplerConfig {
    SamplerConfig { temperature: 0.3, top_k: None, seed: 7, ..SamplerConfig::default() }
}

fn plain() -> Dialogue {
    let mut c = Conversation::new(Some("Be brief.".into()), false);
    c.push_user("Hi");
    c.push_assistant("Hello!");
    c.push_user("Capital of France?");
    c.push_assistant("Paris.");
    Dialogue::Plain(c)
}

fn harmony() -> Dialogue {
    let system = SystemConfig {
        reasoning: ReasoningEffort::High,
        current_date: Some("2025-08-05".into()),
        ..SystemConfig::default()
    };
    let mut h = HarmonyChat::new(system, Some("Answer in French.".into()));
    h.push_user("Capital of Germany?");
    h.push_assistant_final("Berlin.");
    h.push_user("And Italy?");
    h.push_assistant_reasoning("The user asks about Italy.");
    Dialogue::Harmony(h)
}

fn messages(d: &Dialogue) -> Vec<(String, Option<String>, String)> {
    match d {
        Dialogue::Plain(c) => {
            c.messages.iter().map(|m| (m.role.clone(), None, m.content.clone())).collect()
        }
        Dialogue::Harmony(h) => h
            .messages()
            .iter()
            .map(|m| {
                let channel = m.channel.as_ref().map(|c| c.as_str().to_string());
                (m.role.as_str().to_string(), channel, m.content.clone())
            })
            .collect(),
    }
}

#[test]
fn a_chat_template_conversation_round_trips_through_json() {
    let saved = SavedChat::of(&plain(), "org/model", &sampler(), 99);
    let back = SavedChat::parse(&saved.to_json()).unwrap();
    assert_eq!(back, saved);
    assert_eq!(back.format, "chat");
    assert_eq!(back.settings.max_tokens, 99);
    let cfg = back.sampler(64).unwrap();
    assert_eq!((cfg.temperature, cfg.top_k, cfg.seed), (0.3, None, 7));

    let mut restored = Dialogue::Plain(Conversation::new(None, false));
    back.restore(&mut restored).unwrap();
    assert_eq!(messages(&restored), messages(&plain()));
    let Dialogue::Plain(c) = &restored else { unreachable!() };
    assert_eq!(c.system.as_deref(), Some("Be brief."));
}

#[test]
fn a_harmony_conversation_keeps_channels_effort_and_date() {
    let saved = SavedChat::of(&harmony(), "openai/gpt-oss-20b", &sampler(), 512);
    let json = saved.to_json();
    assert!(json.contains("\"channel\": \"analysis\""), "{json}");
    let back = SavedChat::parse(&json).unwrap();
    assert_eq!(back, saved);

    let mut restored = Dialogue::Harmony(HarmonyChat::new(SystemConfig::default(), None));
    back.restore(&mut restored).unwrap();
    assert_eq!(messages(&restored), messages(&harmony()));
    let (Dialogue::Harmony(got), Dialogue::Harmony(want)) = (&restored, &harmony()) else {
        unreachable!()
    };
    assert_eq!(got.system, want.system);
    assert_eq!(got.instructions, want.instructions);
}

/// A gpt-oss conversation continued with a chat-template model: its answers and questions
/// carry over, its reasoning does not (the template has no place for it).
#[test]
fn a_harmony_file_loads_into_a_chat_template_model() {
    let saved = SavedChat::of(&harmony(), "openai/gpt-oss-20b", &sampler(), 512);
    let mut plain = Dialogue::Plain(Conversation::new(None, false));
    saved.restore(&mut plain).unwrap();
    let got: Vec<(String, String)> = messages(&plain).into_iter().map(|(r, _, c)| (r, c)).collect();
    let want = [("user", "Capital of Germany?"), ("assistant", "Berlin."), ("user", "And Italy?")];
    assert_eq!(got, want.map(|(r, c)| (r.to_string(), c.to_string())));
}

#[test]
fn bad_files_are_one_line_of_invalid_input() {
    let good = SavedChat::of(&plain(), "org/model", &sampler(), 99).to_json();
    let cases = [
        ("not json", "{ nope".to_string()),
        ("empty", String::new()),
        ("no messages", good.replace("\"messages\"", "\"msgs\"")),
        ("a robot", good.replacen("\"role\": \"user\"", "\"role\": \"robot\"", 1)),
        ("a system message", good.replacen("\"role\": \"user\"", "\"role\": \"system\"", 1)),
        (
            "a user channel",
            good.replacen("\"role\": \"user\",", "\"role\": \"user\", \"channel\": \"final\",", 1),
        ),
        (
            "a made-up channel",
            good.replacen(
                "\"role\": \"assistant\",",
                "\"role\": \"assistant\", \"channel\": \"x\",",
                1,
            ),
        ),
        ("content a number", good.replacen("\"content\": \"Hi\"", "\"content\": 3", 1)),
        ("top_p out of range", good.replace("\"top_p\": 0.95", "\"top_p\": 2.0")),
        ("a later version", good.replace("\"version\": 1", "\"version\": 9")),
        (
            "a bad effort",
            good.replace("\"settings\"", "\"reasoning_effort\": \"max\", \"settings\""),
        ),
    ];
    for (what, text) in cases {
        assert_ne!(text, good, "{what}: the case changed nothing");
        let err = SavedChat::parse(&text).expect_err(what);
        assert_eq!(kind_of(&err), ErrorKind::InvalidInput, "{what}: {err}");
        assert_eq!(err.to_string().lines().count(), 1, "{what}: {err}");
    }
}

#[test]
fn dropping_the_oldest_turn_keeps_the_system_prompt() {
    let Dialogue::Plain(mut c) = plain() else { unreachable!() };
    assert!(c.drop_oldest_turn());
    assert_eq!(c.messages.len(), 2);
    assert_eq!(c.messages[0].content, "Capital of France?");
    assert_eq!(c.system.as_deref(), Some("Be brief."));
    assert!(!c.drop_oldest_turn(), "the newest turn stays");

    let Dialogue::Harmony(mut h) = harmony() else { unreachable!() };
    assert!(h.drop_oldest_turn());
    let left: Vec<(Role, Option<&Channel>)> =
        h.messages().iter().map(|m| (m.role, m.channel.as_ref())).collect();
    assert_eq!(left, [(Role::User, None), (Role::Assistant, Some(&Channel::Analysis))]);
    assert_eq!(h.instructions.as_deref(), Some("Answer in French."));
    assert!(!h.drop_oldest_turn());
}

#[test]
fn dropping_a_turn_keeps_later_tool_calls_matched() {
    let mut h = HarmonyChat::new(SystemConfig::default(), None);
    h.push_user("first");
    h.push_assistant_final("ok");
    h.push_user("weather?");
    h.push_tool_call("c1", "get_weather", "{}").unwrap();
    assert!(h.drop_oldest_turn());
    // The call moved two places down; its result still finds it.
    h.push_tool_result("c1", "sunny").unwrap();
    assert_eq!(h.pending_calls().count(), 0);
    h.undo_turn();
    assert!(h.messages().is_empty());
}
