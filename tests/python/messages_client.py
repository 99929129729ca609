"""Drives `inferno serve`'s Messages API with the real `anthropic` Python client (PyPI).

    python messages_client.py BASE_URL SCENARIO [JSON_ARGS]

Each scenario checks the protocol with asserts (a failure exits non-zero with the traceback)
and prints one JSON object for the Rust test (tests/serve_messages.rs) to compare further.
BASE_URL is the server's root (http://127.0.0.1:PORT); the SDK appends /v1/messages itself.
"""

import json
import sys

import anthropic
import openai

try:  # the HTTP library the clients use (renamed httpx2 in 2026)
    import httpx2 as httpx
except ImportError:
    import httpx

BASE = sys.argv[1]
SCENARIO = sys.argv[2]
ARGS = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
KEY = ARGS.get("api_key", "unused")

WEATHER = [{"name": "get_weather", "description": "Current weather of a city.",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                             "required": ["city"]}}]


def client(**kw):
    kw.setdefault("api_key", KEY)
    # No retries: an error must reach the test, not be retried away.
    return anthropic.Anthropic(base_url=BASE, max_retries=0, timeout=600, **kw)


def model_id():
    return openai.OpenAI(base_url=BASE + "/v1", api_key=KEY).models.list().data[0].id


def raw_events(body):
    """The SSE events of a streamed request as (event name, data) pairs, checked for shape."""
    events = []
    with httpx.stream("POST", BASE + "/v1/messages", json=body, timeout=600,
                      headers={"x-api-key": KEY, "anthropic-version": "2023-06-01"}) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream"), r.headers
        name = None
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[len("event: "):]
            elif line.startswith("data: "):
                data = json.loads(line[len("data: "):])
                assert data["type"] == name, (name, data)
                events.append((name, data))
                name = None
    return [e for e in events if e[0] != "ping"]


def check_stream_order(events):
    """message_start, then per block start/deltas/stop in index order, message_delta, message_stop."""
    names = [n for n, _ in events]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"], names
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None, start
    assert start["usage"]["input_tokens"] > 0, start
    open_index, next_index = None, 0
    for n, d in events[1:-2]:
        if n == "content_block_start":
            assert open_index is None and d["index"] == next_index, events
            open_index, next_index = d["index"], next_index + 1
        elif n == "content_block_delta":
            assert d["index"] == open_index, events
        else:
            assert n == "content_block_stop" and d["index"] == open_index, events
            open_index = None
    assert open_index is None, events


# Sampling fields are API fields the 2026 SDK no longer has as arguments.
GREEDY = {"extra_body": {"temperature": 0}}


def text_of(message):
    return "".join(b.text for b in message.content if b.type == "text")


def smollm2():
    """Greedy text equals the chat completion's; streaming three ways; stop sequences; count."""
    c = client()
    m = model_id()
    prompt = ARGS.get("prompt", "Name three colors.")
    max_tokens = ARGS.get("max_tokens", 24)
    msgs = [{"role": "user", "content": prompt}]
    chat = openai.OpenAI(base_url=BASE + "/v1", api_key=KEY).chat.completions.create(
        model=m, messages=msgs, max_tokens=max_tokens, temperature=0)
    r = c.messages.create(model=m, messages=msgs, max_tokens=max_tokens, **GREEDY)
    assert r.type == "message" and r.role == "assistant" and r.id.startswith("msg_"), r
    assert [b.type for b in r.content] == ["text"], r.content
    want_reason = {"stop": "end_turn", "length": "max_tokens"}[chat.choices[0].finish_reason]
    assert r.stop_reason == want_reason and r.stop_sequence is None, r
    u = r.usage
    assert u.output_tokens == chat.usage.completion_tokens, (u, chat.usage)
    assert u.input_tokens + u.cache_read_input_tokens == chat.usage.prompt_tokens, (u, chat.usage)
    assert u.cache_creation_input_tokens == 0, u
    # The same prompt again: its prefix comes from the cache and counts as cache reads.
    again = c.messages.create(model=m, messages=msgs, max_tokens=max_tokens, **GREEDY)
    assert again.usage.cache_read_input_tokens > 0, again.usage
    assert again.usage.input_tokens + again.usage.cache_read_input_tokens == chat.usage.prompt_tokens
    count = c.messages.count_tokens(model=m, messages=msgs)
    assert count.input_tokens == chat.usage.prompt_tokens, (count, chat.usage)

    # Streamed with the SDK's helper and with stream=True, and as raw events.
    with c.messages.stream(model=m, messages=msgs, max_tokens=max_tokens, **GREEDY) as s:
        pieces = list(s.text_stream)
        final = s.get_final_message()
    assert "".join(pieces) == text_of(r) == text_of(final), (pieces, r, final)
    assert final.stop_reason == r.stop_reason and final.usage.output_tokens == u.output_tokens, final
    events = list(c.messages.create(model=m, messages=msgs, max_tokens=max_tokens, stream=True, **GREEDY))
    streamed = "".join(e.delta.text for e in events if e.type == "content_block_delta")
    assert streamed == text_of(r), (streamed, r)
    raw = raw_events({"model": m, "messages": msgs, "max_tokens": max_tokens, "temperature": 0,
                      "stream": True})
    check_stream_order(raw)
    assert raw[-2][1]["usage"]["output_tokens"] == u.output_tokens, raw[-2]

    # A stop sequence from the middle of the greedy text ends the reply just before it.
    text = text_of(r)
    words = [w for w in text.split() if len(w) > 3]
    stop = words[len(words) // 2]
    cut = c.messages.create(model=m, messages=msgs, max_tokens=max_tokens,
                            stop_sequences=[stop, "never-appears-xyz"], **GREEDY)
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop, cut
    assert text_of(cut) == text[: text.index(stop)], (cut, text, stop)
    with c.messages.stream(model=m, messages=msgs, max_tokens=max_tokens,
                           stop_sequences=[stop], **GREEDY) as s:
        streamed_cut = s.get_final_message()
    assert streamed_cut.stop_reason == "stop_sequence" and streamed_cut.stop_sequence == stop
    assert text_of(streamed_cut) == text_of(cut)
    # A system prompt as text blocks is the chat's system message.
    sys_chat = openai.OpenAI(base_url=BASE + "/v1", api_key=KEY).chat.completions.create(
        model=m, messages=[{"role": "system", "content": "Be brief."}] + msgs, max_tokens=8, temperature=0)
    sys_msg = c.messages.create(model=m, messages=msgs, max_tokens=8, **GREEDY,
                                system=[{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}])
    assert text_of(sys_msg) == sys_chat.choices[0].message.content, (sys_msg, sys_chat)
    return {"text": text_of(r), "chat": chat.choices[0].message.content, "stop": stop,
            "input_tokens": count.input_tokens}


PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
          "properties": {"name": {"type": "string", "maxLength": 40},
                         "age": {"type": "integer", "minimum": 0, "maximum": 150}}}


def structured():
    """output_config.format and a forced tool_choice (any, tool) constrain the reply (real weights)."""
    import jsonschema

    c, m = client(), model_id()
    msgs = [{"role": "user", "content": "Describe a person as JSON."}]
    fmt = {"output_config": {"format": {"type": "json_schema", "schema": PERSON}}}
    r = c.messages.create(model=m, messages=msgs, max_tokens=80, extra_body={"temperature": 0, **fmt})
    jsonschema.validate(json.loads(text_of(r)), PERSON)
    out = {"json": text_of(r)}
    # Closed arguments (no other keys), so a small model cannot ramble inside them.
    strict = [dict(WEATHER[0], input_schema=dict(WEATHER[0]["input_schema"], additionalProperties=False))]
    for choice in ({"type": "any"}, {"type": "tool", "name": "get_weather"}):
        t = c.messages.create(model=m, messages=[{"role": "user", "content": "What is the weather in Paris?"}],
                              max_tokens=60, tools=strict, tool_choice=choice, **GREEDY)
        uses = [b for b in t.content if b.type == "tool_use"]
        assert uses and uses[0].name == "get_weather" and t.stop_reason == "tool_use", t
        jsonschema.validate(uses[0].input, WEATHER[0]["input_schema"])
        out[choice["type"]] = uses[0].input
    return out


def expect_error(status, kind, fn, contains):
    try:
        fn()
    except anthropic.APIStatusError as e:
        assert e.status_code == status, (e.status_code, e.body)
        assert e.body["type"] == "error" and e.body["error"]["type"] == kind, e.body
        assert contains in e.body["error"]["message"], (contains, e.body)
        return e.body["error"]["message"]
    raise AssertionError(f"no {status} ({contains})")


def errors():
    """Each bad field is a 400 naming it; unknown fields, betas and cache_control are fine."""
    c = client()
    m = model_id()
    user = [{"role": "user", "content": "hi"}]
    ok = dict(model=m, messages=user, max_tokens=2)
    post = c.post
    bad = [
        ({"model": m, "messages": user}, "max_tokens"),
        (dict(ok, max_tokens=0), "max_tokens"),
        (dict(ok, max_tokens="5"), "max_tokens"),
        ({"messages": user, "max_tokens": 2}, "model"),
        (dict(ok, messages=[]), "messages"),
        (dict(ok, messages="hi"), "messages"),
        (dict(ok, messages=[{"role": "robot", "content": "hi"}]), "messages"),
        (dict(ok, messages=[{"role": "user", "content": 5}]), "messages"),
        (dict(ok, messages=[{"role": "user", "content": [{"type": "image", "source": {
            "type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}]), "image"),
        (dict(ok, temperature=2), "temperature"),
        (dict(ok, temperature="hot"), "temperature"),
        (dict(ok, top_p=0), "top_p"),
        (dict(ok, top_k=0), "top_k"),
        (dict(ok, stop_sequences="END"), "stop_sequences"),
        (dict(ok, stream="yes"), "stream"),
        (dict(ok, system=5), "system"),
        (dict(ok, metadata="me"), "metadata"),
        (dict(ok, tools=[{"name": "f"}]), "tools"),
        (dict(ok, tools="all"), "tools"),
        (dict(ok, tool_choice={"type": "any"}), "tool_choice"),
        (dict(ok, tools=WEATHER, tool_choice={"type": "tool", "name": "nope"}), "tool_choice"),
        (dict(ok, tools=WEATHER, tool_choice={"type": "tool"}), "tool_choice"),
        (dict(ok, tool_choice={"type": "sometimes"}), "tool_choice"),
        (dict(ok, thinking={"type": "enabled", "budget_tokens": 10}), "thinking.budget_tokens"),
        (dict(ok, thinking={"type": "maybe"}), "thinking"),
        (dict(ok, output_config={"effort": "extreme"}), "output_config.effort"),
        (dict(ok, output_config={"format": {"type": "xml"}}), "output_config.format"),
        (dict(ok, output_config={"format": {"type": "json_schema", "schema": "x"}}), "output_config.format.schema"),
        (dict(ok, messages=[{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f",
                                                                "input": "x"}]}]), "input"),
    ]
    messages = []
    for body, field in bad:
        messages.append(expect_error(400, "invalid_request_error",
                                     lambda: post("/v1/messages", body=body, cast_to=object), field))
    expect_error(404, "not_found_error",
                 lambda: c.messages.create(model="claude-opus-9", messages=user, max_tokens=2), "claude-opus-9")
    expect_error(400, "invalid_request_error",
                 lambda: c.messages.count_tokens(model=m, messages=[]), "messages")
    # Accepted: unknown fields, betas, cache_control, context_management, server tools,
    # a structured-output schema, thinking and effort, tool_choice none, mid-conversation system.
    r = c.beta.messages.create(
        model=m, max_tokens=2, betas=["context-management-2025-06-27", "made-up-beta-2099-01-01"],
        messages=[{"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]},
                  {"role": "assistant", "content": [{"type": "redacted_thinking", "data": "opaque"},
                                                    {"type": "text", "text": "Hello."}]},
                  {"role": "system", "content": "Answer briefly."},
                  {"role": "user", "content": "again"}],
        context_management={"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        tools=WEATHER + [{"type": "web_search_20250305", "name": "web_search", "max_uses": 1}],
        tool_choice={"type": "none"}, metadata={"user_id": "tester"},
        thinking={"type": "adaptive"},
        extra_body={"temperature": 0.5, "top_p": 0.9, "top_k": 40, "frobnicate": {"x": 1}, "output_config": {"effort": "high", "format": {
            "type": "json_schema", "schema": {"type": "object"}}}},
        extra_headers={"anthropic-version": "2099-01-01", "x-unknown": "1"})
    assert r.type == "message" and r.usage.output_tokens >= 1, r
    return {"messages": messages}


def api_key():
    """x-api-key (api_key=) and Bearer (auth_token=) both work; a wrong key is a 401."""
    m = model_id()
    user = [{"role": "user", "content": "hi"}]
    for c in (client(), anthropic.Anthropic(base_url=BASE, auth_token=KEY, api_key=None, max_retries=0)):
        r = c.messages.create(model=m, messages=user, max_tokens=2)
        assert r.usage.output_tokens >= 1, r
        assert c.messages.count_tokens(model=m, messages=user).input_tokens > 0
    for c in (client(api_key="wrong"), anthropic.Anthropic(base_url=BASE, auth_token="wrong", api_key=None, max_retries=0)):
        expect_error(401, "authentication_error",
                     lambda: c.messages.create(model=m, messages=user, max_tokens=2), "API key")
        expect_error(401, "authentication_error",
                     lambda: c.messages.count_tokens(model=m, messages=user), "API key")
    return {}


CALL = ("<|channel|>analysis<|message|>Need get_weather for Paris.<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
        "<|message|>{\"city\": \"Paris\"}<|call|>")
ANSWER = ("<|channel|>analysis<|message|>21 degrees.<|end|>"
          "<|start|>assistant<|channel|>final<|message|>It is 21 °C in Paris.<|return|>")


def gpt_oss_tools():
    """A forced tool call (thinking + tool_use), its result back, then the final answer."""
    c = client()
    m = model_id()
    user = {"role": "user", "content": "What's the weather in Paris?"}
    kw = dict(model=m, max_tokens=200, tools=WEATHER)
    r = c.messages.create(messages=[user], extra_body={"x_inferno_force_reply": CALL}, **kw)
    assert r.stop_reason == "tool_use", r
    assert [b.type for b in r.content] == ["thinking", "tool_use"], r.content
    thinking, call = r.content
    assert thinking.thinking == "Need get_weather for Paris." and thinking.signature, thinking
    assert call.id.startswith("toolu_") and call.name == "get_weather" and call.input == {"city": "Paris"}, call
    # Streamed, through the SDK's accumulator: the same blocks.
    with c.messages.stream(messages=[user], extra_body={"x_inferno_force_reply": CALL}, **kw) as s:
        final = s.get_final_message()
    assert final.stop_reason == "tool_use", final
    assert [b.type for b in final.content] == ["thinking", "tool_use"], final.content
    assert final.content[0].thinking == thinking.thinking and final.content[0].signature == thinking.signature
    assert final.content[1].name == "get_weather" and final.content[1].input == {"city": "Paris"}, final
    raw = raw_events(dict(kw, messages=[user], stream=True, x_inferno_force_reply=CALL))
    check_stream_order(raw)
    kinds = [d["delta"]["type"] for n, d in raw if n == "content_block_delta"]
    assert kinds.count("signature_delta") == 1 and kinds.index("signature_delta") < kinds.index("input_json_delta"), kinds
    args = "".join(d["delta"]["partial_json"] for n, d in raw if n == "content_block_delta"
                   and d["delta"]["type"] == "input_json_delta")
    assert json.loads(args) == {"city": "Paris"}, args
    # A call without arguments: its input is {} (streamed pieces join into `{}`).
    bare = "<|channel|>commentary to=functions.get_weather<|message|><|call|>"
    raw = raw_events(dict(kw, messages=[user], stream=True, x_inferno_force_reply=bare))
    args = "".join(d["delta"].get("partial_json", "") for n, d in raw if n == "content_block_delta")
    assert args == "{}", raw

    # The result goes back with the thinking; the model answers.
    history = [user, {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r.content]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                             "content": [{"type": "text", "text": "{\"celsius\": 21}"}]}]}]
    r2 = c.messages.create(messages=history, extra_body={"x_inferno_force_reply": ANSWER,
                                                         "x_inferno_prompt_ids": True}, **kw)
    assert r2.stop_reason == "end_turn", r2
    assert [b.type for b in r2.content] == ["thinking", "text"], r2.content
    assert r2.content[1].text == "It is 21 °C in Paris.", r2
    # Inside the open tool loop the thinking is in the prompt; once answered it is dropped.
    no_thinking = [user, {"role": "assistant", "content": [call.model_dump()]}, history[2]]
    n_with = c.messages.count_tokens(model=m, messages=history, tools=WEATHER).input_tokens
    n_without = c.messages.count_tokens(model=m, messages=no_thinking, tools=WEATHER).input_tokens
    assert n_with > n_without, (n_with, n_without)
    closed = history + [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r2.content]},
                        {"role": "user", "content": "Thanks."}]
    closed_plain = no_thinking + [{"role": "assistant", "content": "It is 21 °C in Paris."},
                                  {"role": "user", "content": "Thanks."}]
    assert (c.messages.count_tokens(model=m, messages=closed, tools=WEATHER).input_tokens
            == c.messages.count_tokens(model=m, messages=closed_plain, tools=WEATHER).input_tokens)
    # The same conversation through chat completions renders the same prompt.
    chat_history = [user, {"role": "assistant", "content": None, "reasoning_content": thinking.thinking,
                           "tool_calls": [{"id": call.id, "type": "function", "function": {
                               "name": "get_weather", "arguments": json.dumps(call.input, separators=(",", ":"))}}]},
                    {"role": "tool", "tool_call_id": call.id, "content": "{\"celsius\": 21}"}]
    oai = openai.OpenAI(base_url=BASE + "/v1", api_key=KEY)
    chat_tools = [{"type": "function", "function": {"name": t["name"], "description": t["description"],
                                                    "parameters": t["input_schema"]}} for t in WEATHER]

    def chat_ids(messages, effort, **more):
        r = oai.chat.completions.create(model=m, messages=messages, max_tokens=1, reasoning_effort=effort,
                                        extra_body={"x_inferno_prompt_ids": True}, **more)
        return r.model_extra["x_inferno_prompt_ids"]

    ids = chat_ids(chat_history, "medium", tools=chat_tools)
    assert r2.model_extra["x_inferno_prompt_ids"] == ids and len(ids) == n_with, (len(ids), n_with)
    # Effort and thinking budgets reach the Reasoning line.
    def msg_ids(**more):
        r = c.messages.create(model=m, messages=[user], max_tokens=1,
                              extra_body=dict(more, x_inferno_prompt_ids=True))
        return r.model_extra["x_inferno_prompt_ids"]
    efforts = {e: chat_ids([user], e) for e in ("low", "medium", "high")}
    assert len({tuple(v) for v in efforts.values()}) == 3, efforts
    assert msg_ids(output_config={"effort": "low"}) == efforts["low"]
    assert msg_ids(output_config={"effort": "max"}) == efforts["high"]
    assert msg_ids(thinking={"type": "enabled", "budget_tokens": 2000}) == efforts["low"]
    assert msg_ids(thinking={"type": "enabled", "budget_tokens": 31999}) == efforts["high"]
    assert msg_ids(thinking={"type": "adaptive"}) == efforts["medium"]
    assert msg_ids(thinking={"type": "disabled"}) == efforts["low"]
    # Malformed arguments from the model: the reply still arrives (kept under _raw).
    broken = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": Paris<|call|>"
    r3 = c.messages.create(messages=[user], extra_body={"x_inferno_force_reply": broken}, **kw)
    assert r3.stop_reason == "tool_use" and r3.content[-1].input == {"_raw": "{\"city\": Paris"}, r3
    return {"prompt_tokens": n_with, "call_id": call.id}


if __name__ == "__main__":
    print(json.dumps(globals()[SCENARIO]()))
