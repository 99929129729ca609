"""Drives `inferno serve`'s Responses API with the real `openai` Python client (PyPI).

    python responses_client.py BASE_URL SCENARIO [JSON_ARGS]

Like serve_client.py: each scenario asserts the protocol (a failure exits non-zero with the
traceback) and prints one JSON object for the Rust test (tests/serve_responses.rs) to check.
"""

import json
import sys

import openai

try:  # the HTTP library the openai client uses (renamed httpx2 in 2026)
    import httpx2 as httpx
except ImportError:
    import httpx

BASE = sys.argv[1]
SCENARIO = sys.argv[2]
ARGS = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}

WEATHER = [{"type": "function", "name": "get_weather", "description": "Current weather.",
            "parameters": {"type": "object", "properties": {"location": {"type": "string"}},
                           "required": ["location"]}}]
CALL = ("<|channel|>analysis<|message|>Need get_weather for Tokyo.<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
        "<|message|>{\"location\": \"Tokyo\"}<|call|>")
ANSWER = ("<|channel|>analysis<|message|>21 degrees.<|end|>"
          "<|start|>assistant<|channel|>final<|message|>It is 21 °C in Tokyo.<|return|>")


def client():
    return openai.OpenAI(base_url=BASE + "/v1", api_key="unused", max_retries=0, timeout=600)


def model_id():
    return client().models.list().data[0].id


def streamed(c, **kw):
    """A streamed response: (final response, events), with the event order checked."""
    events = list(c.responses.create(stream=True, **kw))
    assert [e.sequence_number for e in events] == list(range(len(events))), events
    assert events[0].type == "response.created" and events[0].response.status == "in_progress"
    assert events[1].type == "response.in_progress"
    last = events[-1]
    assert last.type in ("response.completed", "response.incomplete"), last
    assert all(e.type not in ("response.completed", "response.incomplete") for e in events[:-1])
    final = last.response
    # Every item: added, its deltas, done; the deltas add up to the final item.
    for i, item in enumerate(final.output):
        mine = [e for e in events if getattr(e, "output_index", None) == i]
        assert mine[0].type == "response.output_item.added" and mine[0].item.id == item.id, mine[0]
        assert mine[-1].type == "response.output_item.done" and mine[-1].item == item, (mine[-1], item)
        deltas = "".join(e.delta for e in mine if e.type.endswith(".delta"))
        if item.type == "message":
            assert deltas == item.content[0].text, (deltas, item)
        elif item.type == "reasoning":
            assert deltas == item.content[0].text, (deltas, item)
            assert [e.type for e in mine if e.type.startswith("response.reasoning_text")][-1] == "response.reasoning_text.done"
        elif item.type == "function_call":
            assert deltas == item.arguments, (deltas, item)
            done = [e for e in mine if e.type == "response.function_call_arguments.done"]
            assert done[0].arguments == item.arguments and done[0].name == item.name, done
    return final, events


def usage_ok(u):
    assert u.input_tokens > 0 and u.output_tokens > 0, u
    assert u.total_tokens == u.input_tokens + u.output_tokens, u
    assert 0 <= u.input_tokens_details.cached_tokens <= u.input_tokens, u
    assert 0 <= u.output_tokens_details.reasoning_tokens <= u.output_tokens, u


# ------------------------------------------------------------------------------- scenarios


PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "city"],
          "properties": {"name": {"type": "string", "maxLength": 40}, "age": {"type": "integer", "minimum": 0,
                         "maximum": 150}, "city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]}}}


def structured():
    """text.format json_schema and a forced tool_choice constrain the reply (real weights)."""
    import jsonschema

    c, m = client(), model_id()
    fmt = {"format": {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}}
    msg = "Describe a person who lives in a European capital, as JSON."
    r = c.responses.create(model=m, input=msg, text=fmt, temperature=0, max_output_tokens=80, store=False)
    jsonschema.validate(json.loads(r.output_text), PERSON)
    s, _ = streamed(c, model=m, input=msg, text=fmt, temperature=0, max_output_tokens=80, store=False)
    assert s.output_text == r.output_text, (s.output_text, r.output_text)
    out = {"json": r.output_text}
    # Closed arguments (no other keys), so a small model cannot ramble inside them.
    strict = [dict(WEATHER[0], parameters=dict(WEATHER[0]["parameters"], additionalProperties=False))]
    for choice in ("required", {"type": "function", "name": "get_weather"}):
        t = c.responses.create(model=m, input="What is the weather in Paris?", tools=strict, tool_choice=choice,
                               temperature=0, max_output_tokens=60, store=False)
        calls = [o for o in t.output if o.type == "function_call"]
        assert calls and calls[0].name == "get_weather", t.output
        jsonschema.validate(json.loads(calls[0].arguments), WEATHER[0]["parameters"])
        out[str(choice)] = calls[0].arguments
    return out


def same_as_chat():
    """Greedy: the Responses text equals chat's for the same message (the same rendering)."""
    c, m = client(), model_id()
    msg, n = ARGS.get("prompt", "What is the capital of France?"), ARGS.get("max_tokens", 24)
    out = {}
    for system in (None, "You are terse."):
        chat_msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": msg}]
        ch = c.chat.completions.create(model=m, messages=chat_msgs, temperature=0, max_tokens=n)
        r = c.responses.create(model=m, input=msg, instructions=system, temperature=0, max_output_tokens=n,
                               store=False)
        usage_ok(r.usage)
        assert r.status in ("completed", "incomplete"), r
        assert r.usage.input_tokens == ch.usage.prompt_tokens, (r.usage, ch.usage)
        assert r.output_text == ch.choices[0].message.content, (r.output_text, ch.choices[0].message.content)
        if ch.choices[0].finish_reason == "length":
            assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens", r
        s, _ = streamed(c, model=m, input=[{"role": "user", "content": [{"type": "input_text", "text": msg}]}],
                        instructions=system, temperature=0, max_output_tokens=n, store=False)
        assert s.output_text == r.output_text, (s.output_text, r.output_text)
        out[system or "none"] = {"responses": r.output_text, "chat": ch.choices[0].message.content}
    return out


def tool_loop():
    """A forced tool call, its output sent back (whole history or previous_response_id), the answer."""
    c, m = client(), model_id()
    user = "What's the weather in Tokyo?"
    kw = dict(model=m, tools=WEATHER, max_output_tokens=200)
    r = c.responses.create(input=user, extra_body={"x_inferno_force_reply": CALL}, **kw)
    assert r.status == "completed", r
    kinds = [o.type for o in r.output]
    assert kinds == ["reasoning", "function_call"], kinds
    rs, call = r.output
    assert rs.summary == [] and rs.content[0].type == "reasoning_text", rs
    assert rs.content[0].text == "Need get_weather for Tokyo.", rs
    assert call.name == "get_weather" and json.loads(call.arguments) == {"location": "Tokyo"}, call
    assert call.call_id.startswith("call_") and call.id.startswith("fc_"), call
    usage_ok(r.usage)
    assert 0 < r.usage.output_tokens_details.reasoning_tokens < r.usage.output_tokens, r.usage
    # Streamed: the same items.
    s, events = streamed(c, input=user, extra_body={"x_inferno_force_reply": CALL}, **kw)
    assert [o.type for o in s.output] == kinds and s.output[1].arguments == call.arguments, s.output
    assert any(e.type == "response.function_call_arguments.delta" for e in events)
    assert s.usage.output_tokens_details.reasoning_tokens == r.usage.output_tokens_details.reasoning_tokens

    # The output goes back: the whole history (ids dropped, as Codex sends it) ...
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "{\"temperature\": 21}"}
    history = [{"role": "user", "content": user}]
    for o in r.output:
        d = o.model_dump(exclude_none=True)
        d.pop("id", None)
        d.pop("status", None)
        history.append(d)
    hooks = {"x_inferno_force_reply": ANSWER, "x_inferno_prompt_ids": True, "x_inferno_date": "2025-03-07"}
    a = c.responses.create(input=history + [result], extra_body=hooks, **kw)
    assert a.output_text == "It is 21 °C in Tokyo.", a
    assert [o.type for o in a.output] == ["reasoning", "message"], a.output
    # ... or by previous_response_id: the same prompt, token for token.
    b = c.responses.create(input=[result], previous_response_id=r.id, extra_body=hooks, **kw)
    assert b.output_text == a.output_text and b.previous_response_id == r.id, b
    ids_a, ids_b = a.model_extra["x_inferno_prompt_ids"], b.model_extra["x_inferno_prompt_ids"]
    assert ids_a == ids_b, "previous_response_id renders a different prompt"
    assert b.usage.input_tokens > r.usage.input_tokens, (b.usage, r.usage)
    # A follow-up turn after the answer: its prompt grows again and reuses the cached prefix.
    f = c.responses.create(input="And in Paris?", previous_response_id=b.id, **kw)
    assert f.usage.input_tokens > b.usage.input_tokens, (f.usage, b.usage)
    assert f.usage.input_tokens_details.cached_tokens > 0, f.usage
    # tool_choice none: no tools rendered, a shorter prompt.
    n = c.responses.input_tokens.count(model=m, input=user, tools=WEATHER, tool_choice="none")
    t = c.responses.input_tokens.count(model=m, input=user, tools=WEATHER)
    assert n.input_tokens < t.input_tokens == r.usage.input_tokens, (n, t, r.usage)
    return {"prompt_ids": ids_a, "tool_output": result["output"]}


def store():
    """Stored responses: GET, DELETE, 404s, store false, the count bound (the server keeps 2)."""
    c, m = client(), model_id()
    kw = dict(model=m, input="hi", max_output_tokens=4, metadata={"k": "v"})
    r = c.responses.create(**kw)
    assert r.metadata == {"k": "v"} and r.store is True, r
    got = c.responses.retrieve(r.id)
    assert got.id == r.id and got.output == r.output and got.usage == r.usage, (got, r)
    c.responses.delete(r.id)
    for f in (lambda: c.responses.retrieve(r.id), lambda: c.responses.delete(r.id)):
        try:
            f()
            raise AssertionError("a deleted response was found")
        except openai.NotFoundError as e:
            assert r.id in e.message, e.message
    off = c.responses.create(**{**kw, "store": False})
    try:
        c.responses.retrieve(off.id)
        raise AssertionError("a response with store false was kept")
    except openai.NotFoundError:
        pass
    # Streamed responses are stored too; the oldest goes past the bound.
    ids = [c.responses.create(**kw).id]
    s, _ = streamed(c, **kw)
    ids.append(s.id)
    ids.append(c.responses.create(**kw).id)
    try:
        c.responses.retrieve(ids[0])
        raise AssertionError("the oldest response was not dropped")
    except openai.NotFoundError:
        pass
    assert [c.responses.retrieve(i).id for i in ids[1:]] == ids[1:]
    try:
        c.responses.create(model=m, input="x", previous_response_id=ids[0])
        raise AssertionError("an unknown previous_response_id was accepted")
    except openai.BadRequestError as e:
        assert e.body["param"] == "previous_response_id", e.body
    return {"ids": ids}


def errors():
    """Bad values of each field: 400 naming it."""
    m = model_id()
    base = {"model": m, "input": "hi", "max_output_tokens": 2}
    cases = [
        ({"input": 5}, "input"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}]}, "input"),
        ({"input": [{"type": "function_call_output", "call_id": "nope", "output": "x"}]}, "input"),
        ({"instructions": 3}, "instructions"),
        ({"tools": [{"type": "file_search"}]}, "tools"),
        ({"tools": [{"type": "function"}]}, "tools"),
        ({"tools": {"type": "function"}}, "tools"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tool_choice": {"type": "function", "name": "f"}, "tools": WEATHER}, "tool_choice"),
        ({"tool_choice": "required", "tools": WEATHER, "text": {"format": {"type": "json_object"}}}, "tool_choice"),
        ({"parallel_tool_calls": "yes"}, "parallel_tool_calls"),
        ({"reasoning": {"effort": "extreme"}}, "reasoning.effort"),
        ({"reasoning": {"summary": "long"}}, "reasoning.summary"),
        ({"reasoning": "high"}, "reasoning"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"max_output_tokens": "many"}, "max_output_tokens"),
        ({"temperature": -1}, "temperature"),
        ({"top_p": 2}, "top_p"),
        ({"metadata": {"k": 1}}, "metadata"),
        ({"metadata": "x"}, "metadata"),
        ({"include": ["everything"]}, "include"),
        ({"include": ["message.output_text.logprobs"]}, "include"),
        ({"store": "yes"}, "store"),
        ({"truncation": "sometimes"}, "truncation"),
        ({"text": {"format": {"type": "xml"}}}, "text.format"),
        ({"text": {"format": {"type": "json_schema", "name": "bad name", "schema": {}}}}, "text.format"),
        ({"text": {"format": {"type": "json_schema", "name": "ok"}}}, "text.format"),
        ({"text": {"verbosity": "loud"}}, "text.verbosity"),
        ({"background": True}, "background"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"prompt": {"id": "pmpt_1"}}, "prompt"),
        ({"previous_response_id": "resp_nope"}, "previous_response_id"),
        ({"input": "x" * 40000}, "input"),
    ]
    seen = []
    with httpx.Client(timeout=600) as h:
        for extra, param in cases:
            resp = h.post(BASE + "/v1/responses", json={**base, **extra})
            body = resp.json()
            assert resp.status_code == 400, (extra, resp.status_code, body)
            assert body["error"]["param"] == param, (extra, body)
            assert body["error"]["message"], body
            seen.append(param)
        # Accepted: what Codex sends beside its requests, and the values that are clamped.
        ok = [{"tools": [{"type": "web_search", "external_web_access": True}]},
              {"include": ["reasoning.encrypted_content"], "prompt_cache_key": "k", "client_metadata": {"a": "b"}},
              {"reasoning": {"effort": "minimal", "summary": "auto"}}, {"reasoning": {"effort": "xhigh"}},
              {"text": {"format": {"type": "json_schema", "name": "a-b_1", "schema": {"type": "object"}, "strict": True}}},
              {"truncation": "disabled", "parallel_tool_calls": False, "store": False, "tool_choice": "none"},
              {"truncation": "auto"}]
        for extra in ok:
            resp = h.post(BASE + "/v1/responses", json={**base, **extra})
            assert resp.status_code == 200, (extra, resp.text)
        r = h.post(BASE + "/v1/responses", json={**base, "reasoning": {"effort": "max"}}).json()
        assert r["reasoning"]["effort"] == "high", r["reasoning"]
        missing = h.get(BASE + "/v1/responses/resp_missing")
        assert missing.status_code == 404 and "resp_missing" in missing.json()["error"]["message"], missing.text
        too_long = h.post(BASE + "/v1/responses", json={**base, "input": "x" * 40000}).json()
        assert too_long["error"]["code"] == "context_length_exceeded", too_long
    return {"params": seen, "too_long": too_long["error"]["message"]}


if __name__ == "__main__":
    print(json.dumps(globals()[SCENARIO]()))
