"""Drives `inferno serve` with the real `openai` Python client (PyPI), as applications do.

    python serve_client.py BASE_URL SCENARIO [JSON_ARGS]

Each scenario checks the protocol with asserts (a failure exits non-zero with the traceback)
and prints one JSON object with what the Rust test compares further (e.g. against
`inferno play`). BASE_URL is the server's root (http://127.0.0.1:PORT); the client gets
BASE_URL/v1. Run by tests/serve*.rs with the venv scripts/test.sh makes.
"""

import concurrent.futures
import json
import math
import random
import sys
import time

import openai

try:  # the HTTP library the openai client uses (renamed httpx2 in 2026)
    import httpx2 as httpx
except ImportError:
    import httpx

BASE = sys.argv[1]
SCENARIO = sys.argv[2]
ARGS = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
KEY = ARGS.get("api_key", "unused")


def client(**kw):
    # No retries: a 503 must reach the test, not be retried away.
    return openai.OpenAI(base_url=BASE + "/v1", api_key=KEY, max_retries=0, timeout=600, **kw)


def model_id():
    return client().models.list().data[0].id


def chat_stream(c, **kw):
    """Streams a chat completion; returns (content, reasoning, finish, usage, chunks)."""
    content, reasoning, finish, usage, n = "", "", None, None, 0
    tools = {}
    for chunk in c.chat.completions.create(stream=True, **kw):
        n += 1
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            d = choice.delta
            content += d.content or ""
            extra = d.model_extra or {}
            r1, r2 = extra.get("reasoning_content"), extra.get("reasoning")
            assert r1 == r2, (r1, r2)
            reasoning += r1 or ""
            for tc in d.tool_calls or []:
                if tc.index not in tools:
                    # The first delta of a call: index, id, type, name.
                    assert tc.id and tc.id.startswith("call_"), tc
                    assert tc.type == "function" and tc.function.name, tc
                    tools[tc.index] = {"id": tc.id, "name": tc.function.name, "arguments": ""}
                else:
                    assert tc.id is None and tc.function.name is None, tc
                tools[tc.index]["arguments"] += tc.function.arguments or ""
            if choice.finish_reason:
                finish = choice.finish_reason
    calls = [tools[i] for i in sorted(tools)]
    return content, reasoning, finish, usage, n, calls


def check_usage(u, completion_max=None):
    assert u is not None
    assert u.prompt_tokens > 0 and u.completion_tokens > 0, u
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens, u
    if completion_max is not None:
        assert u.completion_tokens <= completion_max, u


def no_markup(*texts):
    for t in texts:
        assert "<|" not in (t or ""), f"harmony markup leaked: {t!r}"


# ------------------------------------------------------------------------------- scenarios


def basic():
    """Chat and completions, streamed and not: the same greedy text either way, usage."""
    c = client()
    msgs = [{"role": "user", "content": ARGS["prompt"]}]
    greedy = dict(model=model_id(), messages=msgs, temperature=0, max_tokens=ARGS["max_tokens"])
    r = c.chat.completions.create(**greedy)
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-"), r
    assert len(r.choices) == 1 and r.choices[0].message.role == "assistant"
    assert r.choices[0].finish_reason in ("stop", "length"), r.choices[0].finish_reason
    check_usage(r.usage, ARGS["max_tokens"])
    text = r.choices[0].message.content
    s_text, _, s_finish, s_usage, n, _ = chat_stream(
        c, **greedy, stream_options={"include_usage": True}
    )
    assert s_text == text, (s_text, text)
    assert s_finish == r.choices[0].finish_reason
    assert n >= 3, n
    check_usage(s_usage)
    assert s_usage.completion_tokens == r.usage.completion_tokens, (s_usage, r.usage)
    # Without include_usage no chunk carries usage.
    *_, no_usage, _, _ = chat_stream(c, **greedy)
    assert no_usage is None

    p = dict(model=model_id(), prompt=ARGS["raw"], temperature=0, max_tokens=ARGS["max_tokens"])
    cr = c.completions.create(**p)
    assert cr.object == "text_completion"
    check_usage(cr.usage, ARGS["max_tokens"])
    streamed, finish, usage = "", None, None
    for chunk in c.completions.create(stream=True, stream_options={"include_usage": True}, **p):
        if chunk.usage is not None:
            usage = chunk.usage
        for ch in chunk.choices:
            streamed += ch.text
            finish = ch.finish_reason or finish
    assert streamed == cr.choices[0].text, (streamed, cr.choices[0].text)
    assert finish == cr.choices[0].finish_reason
    check_usage(usage)
    # Token ids as the prompt.
    ids = c.completions.create(model=model_id(), prompt=[1, 2, 3], max_tokens=2, temperature=0)
    assert ids.usage.prompt_tokens == 3, ids.usage
    return {"chat": text, "completion": cr.choices[0].text, "chat_usage": r.usage.model_dump()}


def stop_strings():
    """A stop string cuts the reply before it, streamed or not, with finish_reason stop."""
    c = client()
    msgs = [{"role": "user", "content": ARGS["prompt"]}]
    base = dict(model=model_id(), messages=msgs, temperature=0, max_tokens=ARGS["max_tokens"])
    full = c.chat.completions.create(**base).choices[0].message.content
    words = full.split()
    assert len(words) >= 3, full
    stop = " " + words[2]
    want = full[: full.index(stop)]
    r = c.chat.completions.create(stop=[stop, "never-appears"], **base)
    assert r.choices[0].message.content == want, (r.choices[0].message.content, want)
    assert r.choices[0].finish_reason == "stop"
    s, _, finish, *_ = chat_stream(c, stop=stop, **base)
    assert s == want and finish == "stop", (s, finish)
    cr = c.completions.create(model=model_id(), prompt=ARGS["prompt"], stop=stop, max_tokens=ARGS["max_tokens"], temperature=0)
    assert stop not in cr.choices[0].text
    return {"full": full, "cut": want}


def seeds():
    """The same seed gives the same sampled reply; different seeds differ."""
    c = client()
    msgs = [{"role": "user", "content": ARGS["prompt"]}]
    kw = dict(model=model_id(), messages=msgs, temperature=1.5, max_tokens=24)
    a = c.chat.completions.create(seed=42, **kw).choices[0].message.content
    b = c.chat.completions.create(seed=42, **kw).choices[0].message.content
    assert a == b, (a, b)
    s, *_ = chat_stream(c, seed=42, **kw)
    assert s == a, (s, a)
    others = {c.chat.completions.create(seed=s, **kw).choices[0].message.content for s in (1, 2, 3)}
    assert len(others | {a}) > 1, "four seeds, one reply"
    return {"a": a}


def models():
    c = client()
    data = c.models.list().data
    assert len(data) == 1 and data[0].object == "model", data
    ids = [data[0].id] + ARGS.get("aliases", [])
    for name in ids:
        assert c.models.retrieve(name).id == data[0].id
        r = c.chat.completions.create(model=name, messages=[{"role": "user", "content": "hi"}], max_tokens=1)
        assert r.model == data[0].id
    try:
        c.models.retrieve("no-such-model")
        raise AssertionError("unknown model retrieved")
    except openai.NotFoundError:
        pass
    return {"id": data[0].id}


def expect(status, fn, contains=None):
    try:
        fn()
    except openai.APIStatusError as e:
        assert e.status_code == status, (e.status_code, status, e.message)
        body = e.response.json()
        assert set(body["error"]) >= {"message", "type", "param", "code"}, body
        if contains:
            assert contains in body["error"]["message"], body
        return body["error"]
    raise AssertionError(f"expected HTTP {status}")


def errors():
    """OpenAI error objects with the right statuses."""
    c = client()
    m = model_id()
    hi = [{"role": "user", "content": "hi"}]
    chat = c.chat.completions.create
    out = {}
    out["model"] = expect(404, lambda: chat(model="gpt-4o", messages=hi), "gpt-4o")
    out["temperature"] = expect(400, lambda: chat(model=m, messages=hi, temperature=-1))
    out["n"] = expect(400, lambda: chat(model=m, messages=hi, n=2), "n = 2")
    out["top_logprobs"] = expect(400, lambda: chat(model=m, messages=hi, logprobs=True, top_logprobs=21), "top_logprobs")
    out["top_logprobs_alone"] = expect(400, lambda: chat(model=m, messages=hi, top_logprobs=2), "logprobs: true")
    out["logprobs_int"] = expect(400, lambda: c.completions.create(model=m, prompt="x", logprobs=21), "logprobs")
    out["presence"] = expect(400, lambda: chat(model=m, messages=hi, presence_penalty=2.5), "presence_penalty")
    out["frequency"] = expect(400, lambda: chat(model=m, messages=hi, frequency_penalty=-3), "frequency_penalty")
    out["role"] = expect(400, lambda: chat(model=m, messages=[{"role": "wizard", "content": "x"}]), "wizard")
    out["empty"] = expect(400, lambda: chat(model=m, messages=[]))
    out["max_tokens"] = expect(400, lambda: chat(model=m, messages=hi, max_tokens=0))
    long = "word " * ARGS["context"]
    out["too_long"] = expect(400, lambda: chat(model=m, messages=[{"role": "user", "content": long}]), "context")
    out["completion_too_long"] = expect(400, lambda: c.completions.create(model=m, prompt=long))
    out["best_of"] = expect(400, lambda: c.completions.create(model=m, prompt="x", best_of=3))
    out["tools"] = expect(400, lambda: chat(model=m, messages=hi, tools=[{"type": "function", "function": {}}]),
                          "tools[0]")
    h = httpx.Client(base_url=BASE, timeout=60)
    r = h.post("/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"], r.text
    r = h.post("/v1/chat/completions", json={"messages": "hello"})
    assert r.status_code == 400, r.text
    r = h.post("/v1/chat/completions", json={"model": m, "messages": hi, "temperature": "hot"})
    assert r.status_code == 400, r.text
    r = h.post("/v1/chat/completions", content=b"x" * (ARGS["body_limit"] + 1))
    assert r.status_code == 413 and r.json()["error"]["message"], r.text
    r = h.get("/v1/nowhere")
    assert r.status_code == 404 and r.json()["error"]["message"], r.text
    r = h.get("/v1/chat/completions")
    assert r.status_code == 405, r.text
    # Unknown fields are ignored; `user` is accepted.
    r = h.post("/v1/chat/completions", json={"model": m, "messages": hi, "max_tokens": 1, "user": "u1", "frobnicate": [1]})
    assert r.status_code == 200, r.text
    # Nothing above broke the server.
    assert h.get("/health").status_code == 200
    return out


def api_key():
    """The key is a Bearer token; /health stays open."""
    good = openai.OpenAI(base_url=BASE + "/v1", api_key=ARGS["api_key"], max_retries=0)
    assert good.models.list().data
    r = good.chat.completions.create(model="", messages=[{"role": "user", "content": "hi"}], max_tokens=1)
    assert r.choices
    bad = openai.OpenAI(base_url=BASE + "/v1", api_key="wrong", max_retries=0)
    for fn in (lambda: bad.models.list(), lambda: bad.chat.completions.create(model="", messages=[], max_tokens=1)):
        try:
            fn()
            raise AssertionError("a wrong key was accepted")
        except openai.AuthenticationError as e:
            assert e.status_code == 401
    h = httpx.Client(base_url=BASE, timeout=60)
    assert h.get("/health").status_code == 200
    assert h.get("/metrics").status_code == 401
    assert h.get("/metrics", headers={"authorization": "Bearer " + ARGS["api_key"]}).status_code == 200
    return {}


def queue_full():
    """With every slot taken, the next request gets 503 with Retry-After."""
    c = client()
    m = model_id()
    h = httpx.Client(base_url=BASE, timeout=600)
    body = {"model": m, "messages": [{"role": "user", "content": "Tell me a long story."}],
            "max_tokens": 4000, "stream": True, "temperature": 1.0}
    with h.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        next(lines)  # the request is admitted
        err = expect(503, lambda: c.chat.completions.create(model=m, messages=[{"role": "user", "content": "hi"}], max_tokens=1))
        raw = h.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})
        assert raw.status_code == 503 and int(raw.headers["retry-after"]) >= 1, raw.headers
    # The first stream is closed: its slot frees and requests are served again.
    deadline = time.time() + 60
    while True:
        r = h.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})
        if r.status_code == 200:
            break
        assert time.time() < deadline, "the slot of a closed stream was not freed"
        time.sleep(0.2)
    return {"error": err}


def keep_alive():
    """A stream waiting for its turn gets `: keep-alive` comments before its first token."""
    h = httpx.Client(base_url=BASE, timeout=600)
    long = {"messages": [{"role": "user", "content": "Tell me a long story."}], "max_tokens": ARGS["busy_tokens"],
            "stream": True, "temperature": 1.0}
    busy_client = httpx.Client(base_url=BASE, timeout=600)
    busy = busy_client.send(busy_client.build_request("POST", "/v1/chat/completions", json=long), stream=True)
    next(busy.iter_lines())
    waiting = dict(long, max_tokens=2)
    comments, content = 0, None
    with h.stream("POST", "/v1/chat/completions", json=waiting) as r:
        for line in r.iter_lines():
            if line.startswith(":"):
                comments += 1
                # The busy stream goes away (cancelled): the waiting one runs.
                busy.close()
                busy_client.close()
            elif line.startswith("data: {") and '"content":"' in line and '"role"' not in line:
                content = line
                break
    assert comments >= 1 and content, (comments, content)
    return {"comments": comments}


def stream_until_interrupted():
    """Reads a long stream until the server ends it (shutdown): an error event, no hang."""
    c = client()
    got = ""
    try:
        for chunk in c.chat.completions.create(model=model_id(), stream=True, max_tokens=100000,
                                               messages=[{"role": "user", "content": "Count forever."}]):
            for ch in chunk.choices:
                got += ch.delta.content or ""
            if ARGS.get("ready_file"):
                open(ARGS["ready_file"], "w").close()
    except openai.APIError as e:
        return {"error": str(e), "got": got}
    raise AssertionError("the stream ended without an error")


def harmony_chat():
    """gpt-oss: reasoning and answer apart, no markup anywhere, streamed equals whole."""
    c = client()
    out = {}
    for effort in ("low", "high"):
        kw = dict(model=model_id(), temperature=0, max_tokens=ARGS["max_tokens"], reasoning_effort=effort,
                  messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": ARGS["prompt"]}])
        r = c.chat.completions.create(**kw)
        msg = r.choices[0].message
        extra = msg.model_extra or {}
        assert extra.get("reasoning_content") == extra.get("reasoning"), extra
        no_markup(msg.content, extra.get("reasoning_content"))
        check_usage(r.usage, ARGS["max_tokens"])
        content, reasoning, finish, _, _, calls = chat_stream(c, **kw)
        assert content == (msg.content or ""), (content, msg.content)
        assert reasoning == (extra.get("reasoning_content") or ""), (reasoning, extra)
        assert finish == r.choices[0].finish_reason
        out[effort] = {"content": msg.content, "reasoning": extra.get("reasoning_content"), "finish": finish,
                       "prompt_tokens": r.usage.prompt_tokens}
    # ollama's spelling of the effort.
    r = client().post("/chat/completions", cast_to=object, body={
        "model": model_id(), "max_tokens": 1, "reasoning": {"effort": "high"},
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": ARGS["prompt"]}]})
    assert r["usage"]["prompt_tokens"] == out["high"]["prompt_tokens"], r
    expect(400, lambda: c.chat.completions.create(model=model_id(), messages=[{"role": "user", "content": "x"}],
                                                  reasoning_effort="extreme"))
    return out


WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "Gets the current weather in the provided location.",
    "parameters": {"type": "object", "properties": {
        "location": {"type": "string", "description": "The city and state, e.g. San Francisco, CA"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"}},
        "required": ["location"]}}}]


def tool_calls():
    """A tool call, its result and the final answer through the API (forced replies)."""
    tools = ARGS.get("tools", WEATHER)
    c = client()
    m = model_id()
    user = {"role": "user", "content": "What's the weather in Tokyo?"}
    call_reply = ("<|channel|>analysis<|message|>Need get_weather for Tokyo.<|end|>"
                  "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
                  "<|message|>{\"location\": \"Tokyo\"}<|call|>")
    kw = dict(model=m, messages=[user], tools=tools, max_tokens=200)
    r = c.chat.completions.create(extra_body={"x_inferno_force_reply": call_reply}, **kw)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls", ch
    assert ch.message.content is None, ch.message
    assert ch.message.model_extra["reasoning_content"] == "Need get_weather for Tokyo.", ch.message
    [call] = ch.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_"), call
    assert call.function.name == "get_weather", call
    assert json.loads(call.function.arguments) == {"location": "Tokyo"}, call
    # Streamed: the same call as deltas.
    content, reasoning, finish, _, _, calls = chat_stream(c, extra_body={"x_inferno_force_reply": call_reply}, **kw)
    assert finish == "tool_calls" and content == "", (finish, content)
    assert reasoning == "Need get_weather for Tokyo."
    assert [(x["name"], x["arguments"]) for x in calls] == [("get_weather", call.function.arguments)], calls

    # The result goes back; the model answers.
    history = [user, {"role": "assistant", "content": None, "tool_calls": [call.model_dump()],
                      "reasoning_content": "Need get_weather for Tokyo."},
               {"role": "tool", "tool_call_id": call.id, "content": "{\"temperature\": 21, \"unit\": \"celsius\"}"}]
    answer = "<|channel|>analysis<|message|>21 degrees. Answer.<|end|><|start|>assistant<|channel|>final<|message|>It is 21 °C in Tokyo.<|return|>"
    r2 = c.chat.completions.create(model=m, messages=history, tools=tools, max_tokens=200,
                                   extra_body={"x_inferno_force_reply": answer, "x_inferno_prompt_ids": True,
                                               "x_inferno_date": "2025-03-07"})
    ch2 = r2.choices[0]
    assert ch2.finish_reason == "stop" and ch2.message.content == "It is 21 °C in Tokyo.", ch2
    assert ch2.message.model_extra["reasoning"] == "21 degrees. Answer.", ch2.message
    assert not ch2.message.tool_calls
    # Invalid JSON arguments from the model stay a string for the client: never a 500.
    bad = ("<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"location\": Tokyo<|call|>")
    r3 = c.chat.completions.create(extra_body={"x_inferno_force_reply": bad}, **kw)
    assert r3.choices[0].message.tool_calls[0].function.arguments == "{\"location\": Tokyo"
    # Markup in odd places never reaches a name, content or reasoning.
    odd = ("<|channel|>analysis<|message|>hmm<|start|>assistant to=functions.get_weather<|channel|>analysis"
           "<|message|>{}<|call|>")
    r4 = c.chat.completions.create(extra_body={"x_inferno_force_reply": odd}, **kw)
    msg = r4.choices[0].message
    no_markup(msg.content, msg.model_extra.get("reasoning_content"), *[t.function.name for t in msg.tool_calls or []])
    return {"prompt_ids": r2.model_extra["x_inferno_prompt_ids"], "call_id": call.id}


def entries_of(logprobs):
    """A chat choice's `logprobs.content` as plain dicts ([] when there is none)."""
    return [e.model_dump() for e in (logprobs.content or [])] if logprobs else []


def check_entries(entries, greedy, top):
    """What holds for any logprobs: alternatives most likely first, a distribution's share at
    most, `token` the text of `bytes`; the chosen token is listed with its own number when it
    ranks among them, and ranks below all of them otherwise (greedy: it is the first)."""
    for e in entries:
        alts = e["top_logprobs"]
        assert len(alts) == top, e
        lps = [a["logprob"] for a in alts]
        assert lps == sorted(lps, reverse=True), e
        assert all(x <= 0 for x in lps) and e["logprob"] <= 0, e
        assert sum(math.exp(x) for x in lps) <= 1 + 1e-4, e
        for t in [e] + alts:
            assert bytes(t["bytes"]).decode("utf-8", "replace") == t["token"], t
        same = [a for a in alts if a["bytes"] == e["bytes"]]
        if same:
            assert abs(same[0]["logprob"] - e["logprob"]) < 1e-6, e
        else:
            assert e["logprob"] <= lps[-1] + 1e-6, e
        if greedy:
            assert alts[0]["bytes"] == e["bytes"], e


def near(x, y, tol=1e-4):
    """Equal up to float noise: a request that finds its prompt in the prefix cache computes the
    rest of it in other shapes, so the last bits of its logits may differ (relative to their
    size: a random model's logits reach tens)."""
    return abs(x - y) <= tol * max(1.0, abs(x))


def same_entries(a, b):
    """Two lists of logprob entries: the same tokens, the same numbers up to float noise."""
    def close(x, y):
        return x["token"] == y["token"] and x["bytes"] == y["bytes"] and near(x["logprob"], y["logprob"])

    assert len(a) == len(b), (len(a), len(b))
    for x, y in zip(a, b):
        assert close(x, y) and len(x["top_logprobs"]) == len(y["top_logprobs"]), (x, y)
        # Alternatives whose numbers are that close may swap places.
        for p, q in zip(x["top_logprobs"], y["top_logprobs"]):
            assert close(p, q) or near(p["logprob"], q["logprob"]), (x, y)
    return True


def stream_logprobs(c, **kw):
    """A streamed chat's content and logprob entries; every chunk with entries has the text of
    their tokens or ends the reply."""
    content, entries = "", []
    for chunk in c.chat.completions.create(stream=True, **kw):
        for ch in chunk.choices:
            got = entries_of(ch.logprobs)
            assert not got or ch.delta.content or ch.finish_reason, chunk
            entries += got
            content += ch.delta.content or ""
    return content, entries


def chat_logprobs():
    """Chat logprobs: consistent, the same streamed or not, the same numbers as /v1/completions
    gives for the same ids, and absent unless asked."""
    c = client()
    m = model_id()
    msgs = [{"role": "user", "content": ARGS["prompt"]}]
    n = ARGS["max_tokens"]
    kw = dict(model=m, messages=msgs, temperature=0, max_tokens=n, logprobs=True, top_logprobs=5)
    r = c.chat.completions.create(**kw, extra_body={"x_inferno_prompt_ids": True})
    ch = r.choices[0]
    whole = entries_of(ch.logprobs)
    check_entries(whole, greedy=True, top=5)
    # One entry per token of the text (the end-of-sequence token is not text).
    eos = 1 if ch.finish_reason == "stop" else 0
    assert len(whole) == r.usage.completion_tokens - eos, (len(whole), r.usage)
    assert b"".join(bytes(e["bytes"]) for e in whole).decode() == ch.message.content
    content, streamed = stream_logprobs(c, **kw)
    assert content == ch.message.content and same_entries(streamed, whole), content
    plain = c.chat.completions.create(model=m, messages=msgs, temperature=0, max_tokens=4)
    assert plain.choices[0].logprobs is None
    # The chat's prompt ids continued as a raw completion: the same tokens, the same numbers.
    ids = r.model_extra["x_inferno_prompt_ids"]
    cr = c.completions.create(model=m, prompt=ids, temperature=0, max_tokens=n, logprobs=5)
    lp = cr.choices[0].logprobs
    assert cr.choices[0].text == ch.message.content, (cr.choices[0].text, ch.message.content)
    assert lp.tokens == [e["token"] for e in whole], lp.tokens
    for e, got, alts in zip(whole, lp.token_logprobs, lp.top_logprobs):
        assert near(e["logprob"], got), (e, got)
        want = {a["token"]: a["logprob"] for a in e["top_logprobs"]}
        assert alts.keys() == want.keys() and all(near(alts[k], want[k]) for k in want), (alts, want)
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    streamed_lp = {"tokens": [], "token_logprobs": [], "text_offset": []}
    for chunk in c.completions.create(model=m, prompt=ids, temperature=0, max_tokens=n, logprobs=5, stream=True):
        for choice in chunk.choices:
            for k in streamed_lp:
                streamed_lp[k] += getattr(choice.logprobs, k) if choice.logprobs else []
    assert streamed_lp["tokens"] == lp.tokens and streamed_lp["text_offset"] == lp.text_offset, streamed_lp
    assert all(near(a, b) for a, b in zip(streamed_lp["token_logprobs"], lp.token_logprobs)), streamed_lp
    # Sampled: the drawn token is listed where its number ranks it.
    hot = dict(kw, temperature=1.0, seed=5, top_logprobs=20)
    check_entries(entries_of(c.chat.completions.create(**hot).choices[0].logprobs), greedy=False, top=20)
    return {"entries": len(whole), "content": ch.message.content}


def completion_logprobs():
    """Completions logprobs for token ids, streamed equal to whole; the whole ones returned."""
    c = client()
    kw = dict(model=model_id(), prompt=ARGS["prompt"], temperature=0, max_tokens=ARGS["max_tokens"],
              logprobs=ARGS["top"], extra_body={"return_tokens_as_token_ids": True})
    whole = c.completions.create(**kw).choices[0].logprobs
    tokens, lps = [], []
    for chunk in c.completions.create(stream=True, **kw):
        for ch in chunk.choices:
            if ch.logprobs:
                tokens += ch.logprobs.tokens
                lps += ch.logprobs.token_logprobs
    assert tokens == whole.tokens, (tokens, whole.tokens)
    assert all(near(a, b) for a, b in zip(lps, whole.token_logprobs)), (lps, whole.token_logprobs)
    return whole.model_dump()


def token_id(t):
    assert t.startswith("token_id:"), t
    return int(t.split(":", 1)[1])


def penalties():
    """Greedy with presence/frequency penalties picks, at every step, the token whose raw
    logprob minus `presence * (count > 0) + frequency * count` (count: in the reply so far) is
    highest, among the 20 most likely and the one chosen: OpenAI's formula, recomputed here
    from the server's own raw logprobs."""
    c = client()
    msgs = [{"role": "user", "content": ARGS["prompt"]}]
    base = dict(model=model_id(), messages=msgs, temperature=0, max_tokens=ARGS["max_tokens"], logprobs=True,
                top_logprobs=20, extra_body={"return_tokens_as_token_ids": True})
    replies = []
    for presence, frequency in ARGS["penalties"]:
        r = c.chat.completions.create(presence_penalty=presence, frequency_penalty=frequency, **base)
        counts = {}
        for step, e in enumerate(entries_of(r.choices[0].logprobs)):
            chosen = token_id(e["token"])
            cands = {token_id(a["token"]): a["logprob"] for a in e["top_logprobs"]}
            cands[chosen] = e["logprob"]

            def score(t):
                k = counts.get(t, 0)
                return cands[t] - presence * (k > 0) - frequency * k

            best = max(cands, key=score)
            assert score(chosen) >= score(best) - 1e-4, (presence, frequency, step, chosen, best, cands, counts)
            counts[chosen] = counts.get(chosen, 0) + 1
        replies.append(r.choices[0].message.content)
    return {"replies": replies}


LLAMA_CALL = '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}'


def openai_history(messages):
    """A fixture's conversation in OpenAI's shape: a call's arguments as a JSON string (transformers'
    fixtures hold them as a dict, as templates receive them)."""
    history = []
    for msg in messages:
        msg = dict(msg)
        if msg.get("tool_calls"):
            msg["tool_calls"] = [dict(t, function=dict(t["function"], arguments=json.dumps(t["function"]["arguments"])))
                                 for t in msg["tool_calls"]]
        history.append(msg)
    return history


def llama_tool_calls():
    """A plain (Llama 3.1 template) model's JSON call becomes tool_calls, streamed too; anything
    else stays text; the call and its result render back through the template."""
    c = client()
    m = model_id()
    tools = ARGS["tools"]
    user = {"role": "user", "content": "What's the weather in Paris?"}
    kw = dict(model=m, messages=[user], tools=tools, max_tokens=200)

    def forced(text, **more):
        return c.chat.completions.create(extra_body={"x_inferno_force_reply": text}, **dict(kw, **more))

    r = forced(LLAMA_CALL)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls" and ch.message.content is None, ch
    [call] = ch.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_") and call.function.name == "get_weather", call
    assert json.loads(call.function.arguments) == {"city": "Paris", "unit": "celsius"}, call
    content, _, finish, _, _, calls = chat_stream(c, extra_body={"x_inferno_force_reply": LLAMA_CALL}, **kw)
    assert finish == "tool_calls" and content == "", (finish, content)
    assert [(x["name"], x["arguments"]) for x in calls] == [("get_weather", call.function.arguments)], calls
    # Several calls, the `arguments` spelling.
    two = '{"name": "get_weather", "arguments": {"city": "Paris"}}; {"name": "get_weather", "arguments": {"city": "Rome"}}'
    got = [json.loads(t.function.arguments)["city"] for t in forced(two).choices[0].message.tool_calls]
    assert got == ["Paris", "Rome"], got
    # Not a call to an offered tool, or not a call at all: the text, as it was.
    for text in ['{"name": "rm_rf", "parameters": {}}', '{"city": "Paris"}', "Sunny, 21 degrees.",
                 '{"name": "get_weather", "parameters": {']:
        ch = forced(text).choices[0]
        assert ch.message.content == text and not ch.message.tool_calls and ch.finish_reason != "tool_calls", ch
        content, _, finish, _, _, calls = chat_stream(c, extra_body={"x_inferno_force_reply": text}, **kw)
        assert content == text and not calls and finish != "tool_calls", (content, calls)
    # Without tools in the request, a call's JSON is text.
    ch = c.chat.completions.create(model=m, messages=[user], max_tokens=200,
                                   extra_body={"x_inferno_force_reply": LLAMA_CALL}).choices[0]
    assert ch.message.content == LLAMA_CALL and not ch.message.tool_calls, ch
    # The call and its result go back (OpenAI's shape: arguments as a JSON string).
    history = openai_history(ARGS["messages"])
    answer = "It is 21 °C in Paris."
    r2 = c.chat.completions.create(model=m, messages=history, tools=tools, max_tokens=200,
                                   extra_body={"x_inferno_force_reply": answer, "x_inferno_prompt_ids": True})
    ch2 = r2.choices[0]
    assert ch2.message.content == answer and not ch2.message.tool_calls, ch2
    return {"prompt_ids": r2.model_extra["x_inferno_prompt_ids"]}


def qwen3_replies():
    """Qwen3's replies (Hermes reader): reasoning apart from the answer, a <tool_call> block to an
    offered tool as tool_calls, streamed too, and its result rendered back; thinking off through
    chat_template_kwargs; a json_schema reply that parses."""
    c = client()
    m = model_id()
    user = {"role": "user", "content": "What's the weather in Paris?"}
    tools = ARGS["tools"]
    kw = dict(model=m, messages=[user], tools=tools, max_tokens=200)
    call = ('<think>\nThe user wants the weather.\n</think>\n\n<tool_call>\n'
            '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>')
    force = {"x_inferno_force_reply": call}
    ch = c.chat.completions.create(extra_body=force, **kw).choices[0]
    assert ch.finish_reason == "tool_calls" and not ch.message.content, ch
    assert ch.message.model_extra.get("reasoning_content") == "\nThe user wants the weather.\n", ch
    [tc] = ch.message.tool_calls
    assert tc.function.name == "get_weather" and json.loads(tc.function.arguments) == {"city": "Paris"}, tc
    content, reasoning, finish, _, _, calls = chat_stream(c, extra_body=force, **kw)
    assert (content, finish) == ("", "tool_calls") and reasoning == "\nThe user wants the weather.\n", (content, finish)
    assert [(x["name"], json.loads(x["arguments"])) for x in calls] == [("get_weather", {"city": "Paris"})], calls
    # An answer after reasoning; a call to a tool not offered stays text.
    ch = c.chat.completions.create(extra_body={"x_inferno_force_reply": "<think>\nEasy.\n</think>\n\nIt is 4."},
                                   **kw).choices[0]
    assert ch.message.content == "It is 4." and ch.message.model_extra.get("reasoning_content") == "\nEasy.\n", ch
    rogue = '<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>'
    # (A forced reply ends where its text does: <|im_end|> ends it as the model would.)
    ch = c.chat.completions.create(extra_body={"x_inferno_force_reply": rogue + "<|im_end|>"}, **kw).choices[0]
    assert ch.message.content == rogue and not ch.message.tool_calls and ch.finish_reason == "stop", ch
    # A call and its result go back through the template (OpenAI's shape: arguments as a JSON string).
    history = openai_history(ARGS["messages"])
    r = c.chat.completions.create(model=m, messages=history, tools=tools, max_tokens=50,
                                  extra_body={"x_inferno_force_reply": "It is 21 C.", "x_inferno_prompt_ids": True})
    assert r.choices[0].message.content == "It is 21 C.", r
    with_result = r.model_extra["x_inferno_prompt_ids"]
    # Thinking off: the template's empty reasoning block ends the prompt.
    r = c.chat.completions.create(model=m, messages=ARGS["thinking_messages"], max_tokens=20,
                                  extra_body={"x_inferno_force_reply": "Hi.", "x_inferno_prompt_ids": True,
                                              "chat_template_kwargs": {"enable_thinking": False}})
    assert r.choices[0].message.content == "Hi.", r
    thinking_off = r.model_extra["x_inferno_prompt_ids"]
    # A structured output: the schema's one shape.
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    r = c.chat.completions.create(model=m, messages=[user], max_tokens=50, temperature=0,
                                  response_format={"type": "json_schema",
                                                   "json_schema": {"name": "ok", "strict": True, "schema": schema}})
    value = json.loads(r.choices[0].message.content)
    assert isinstance(value, dict) and set(value) == {"ok"} and isinstance(value["ok"], bool), value
    return {"with_result": with_result, "thinking_off": thinking_off}


def polyfill_tools():
    """A model whose template has no tool support still takes `tools` (described in the system
    message); a reply in the JSON syntax it was asked for becomes tool_calls, streamed too; the
    call and its result render back."""
    c = client()
    m = model_id()
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    user = {"role": "user", "content": "What's the weather in Paris?"}
    hooks = {"x_inferno_prompt_ids": True}
    plain = c.chat.completions.create(model=m, messages=[user], max_tokens=4, extra_body=hooks)
    offered = c.chat.completions.create(model=m, messages=[user], tools=tools, max_tokens=4, extra_body=hooks)
    assert offered.usage.prompt_tokens > plain.usage.prompt_tokens + 20, (offered.usage, plain.usage)
    call = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    r = c.chat.completions.create(model=m, messages=[user], tools=tools, max_tokens=60,
                                  extra_body={"x_inferno_force_reply": call})
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls" and ch.message.content is None, ch
    [tc] = ch.message.tool_calls
    assert tc.function.name == "get_weather" and json.loads(tc.function.arguments) == {"city": "Paris"}, tc
    _, _, finish, _, _, calls = chat_stream(c, model=m, messages=[user], tools=tools, max_tokens=60,
                                            extra_body={"x_inferno_force_reply": call})
    assert finish == "tool_calls" and [x["name"] for x in calls] == ["get_weather"], (finish, calls)
    history = [user, {"role": "assistant", "content": None, "tool_calls": [
        {"id": tc.id, "type": "function", "function": {"name": "get_weather", "arguments": tc.function.arguments}}]},
        {"role": "tool", "tool_call_id": tc.id, "content": "18 C, cloudy"}]
    answer = "It is 18 C and cloudy in Paris."
    r2 = c.chat.completions.create(model=m, messages=history, tools=tools, max_tokens=60,
                                   extra_body={"x_inferno_force_reply": answer, **hooks})
    assert r2.choices[0].message.content == answer and not r2.choices[0].message.tool_calls, r2
    return {"offered": offered.model_extra["x_inferno_prompt_ids"],
            "round_trip": r2.model_extra["x_inferno_prompt_ids"]}


def harmony_preamble_and_logprobs():
    """gpt-oss: a preamble is content (reasoning apart, the call parsed); logprobs cover the
    visible content's tokens only, never markup; a preamble and an answer join on a newline."""
    c = client()
    m = model_id()
    preamble = "Checking the weather in Tokyo for you."
    reply = ("<|channel|>analysis<|message|>Need get_weather for Tokyo.<|end|>"
             f"<|start|>assistant<|channel|>commentary<|message|>{preamble}<|end|>"
             "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
             "<|message|>{\"location\": \"Tokyo\"}<|call|>")
    kw = dict(model=m, messages=[{"role": "user", "content": "What's the weather in Tokyo?"}], tools=WEATHER,
              max_tokens=200, logprobs=True, top_logprobs=3, extra_body={"x_inferno_force_reply": reply})
    r = c.chat.completions.create(**kw)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls" and ch.message.content == preamble, ch
    assert ch.message.model_extra["reasoning_content"] == "Need get_weather for Tokyo.", ch.message
    assert [t.function.name for t in ch.message.tool_calls] == ["get_weather"], ch.message
    entries = entries_of(ch.logprobs)
    check_entries(entries, greedy=False, top=3)
    no_markup(*[e["token"] for e in entries])
    assert b"".join(bytes(e["bytes"]) for e in entries).decode() == preamble, entries
    assert len(entries) < r.usage.completion_tokens
    content, reasoning, finish, _, _, calls = chat_stream(c, **kw)
    assert (content, reasoning, finish) == (preamble, "Need get_weather for Tokyo.", "tool_calls")
    assert [x["name"] for x in calls] == ["get_weather"], calls
    s_content, s_entries = stream_logprobs(c, **kw)
    assert s_content == preamble and same_entries(s_entries, entries)
    both = ("<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>commentary<|message|>"
            "One moment.<|end|><|start|>assistant<|channel|>final<|message|>It is 21 °C.<|return|>")
    kw["extra_body"] = {"x_inferno_force_reply": both}
    ch = c.chat.completions.create(**kw).choices[0]
    assert ch.message.content == "One moment.\nIt is 21 °C." and ch.finish_reason == "stop", ch
    assert b"".join(bytes(e["bytes"]) for e in entries_of(ch.logprobs)).decode() == "One moment.It is 21 °C."
    assert chat_stream(c, **kw)[0] == ch.message.content
    return {"content": ch.message.content}


def harmony_fixtures():
    """Prompts rendered by the server equal openai-harmony's (tests/fixtures/harmony.json)."""
    fx = json.load(open(ARGS["fixtures"]))
    c = client()
    done = []
    for case in fx["render"]:
        if case["system"]["model_identity"] != "You are ChatGPT, a large language model trained by OpenAI." \
                or case["system"]["current_date"] is None or "note" in case:
            continue
        msgs = openai_messages(case)
        if msgs is None:
            continue
        body = {"model": model_id(), "messages": msgs, "max_tokens": 1, "reasoning_effort": case["system"]["reasoning"],
                "x_inferno_prompt_ids": True, "x_inferno_date": case["system"]["current_date"]}
        if case.get("tools"):
            body["tools"] = case["tools"]
        r = c.post("/chat/completions", cast_to=object, body=body)
        assert r["x_inferno_prompt_ids"] == case["expected_ids"], case["name"]
        done.append(case["name"])
    return {"cases": done}


def openai_messages(case):
    """A harmony fixture conversation as OpenAI chat messages (None if it has no such form)."""
    out = []
    if case["instructions"]:
        out.append({"role": "system", "content": case["instructions"]})
    reasoning, preamble, calls = None, None, {}
    for m in case["messages"]:
        role, ch = m["role"], m["channel"]
        if role == "user":
            out.append({"role": "user", "content": m["content"]})
        elif role == "assistant" and ch == "analysis":
            reasoning = m["content"]
        elif role == "assistant" and ch == "commentary" and not m["recipient"]:
            preamble = m["content"]  # the content of the message that makes the call
        elif role == "assistant" and (m["recipient"] or "").startswith("functions."):
            name = m["recipient"].split(".", 1)[1]
            cid = f"call_{len(calls)}"
            calls[name] = cid
            msg = {"role": "assistant", "content": preamble,
                   "tool_calls": [{"id": cid, "type": "function", "function": {"name": name, "arguments": m["content"]}}]}
            preamble = None
            if reasoning:
                msg["reasoning_content"] = reasoning
            reasoning = None
            out.append(msg)
        elif role == "tool":
            out.append({"role": "tool", "tool_call_id": calls[m["name"].split(".", 1)[1]], "content": m["content"]})
        elif role == "assistant" and ch == "final":
            msg = {"role": "assistant", "content": m["content"]}
            if reasoning:
                msg["reasoning"] = reasoning
            reasoning = None
            out.append(msg)
        else:
            return None
    if reasoning is not None or preamble is not None:
        return None
    return out


def load():
    """Many concurrent streams: each equals the reply it gets alone (greedy)."""
    prompts = ARGS["prompts"]
    c = client()
    m = model_id()

    def one(p):
        content, _, finish, usage, _, _ = chat_stream(
            c, model=m, messages=[{"role": "user", "content": p}], temperature=0,
            max_tokens=ARGS["max_tokens"], stream_options={"include_usage": True})
        return content, finish, usage.completion_tokens

    started = time.time()
    alone = [one(p)[0] for p in prompts] if ARGS.get("alone") else None
    alone_s = time.time() - started
    started = time.time()
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        together = list(pool.map(one, prompts))
    wall = time.time() - started
    return {"replies": [t[0] for t in together], "alone": alone, "finish": [t[1] for t in together],
            "tokens": sum(t[2] for t in together), "wall_s": wall, "alone_s": alone_s}


def disconnects():
    """Requests whose clients go away at random points; all must be cancelled."""
    n = ARGS["requests"]
    rng = random.Random(ARGS.get("seed", 0))
    m = model_id()

    def one(i):
        h = httpx.Client(base_url=BASE, timeout=600)
        stream = rng.random() < 0.7
        body = {"model": m, "messages": [{"role": "user", "content": f"Story number {i}, please."}],
                "max_tokens": 10000, "temperature": 1.0, "stream": stream}
        after = rng.choice([0, 1, 3, 8])
        try:
            if stream:
                with h.stream("POST", "/v1/chat/completions", json=body) as r:
                    for k, _ in enumerate(r.iter_lines()):
                        if k >= after:
                            break
            else:
                h.post("/v1/chat/completions", json=body, timeout=0.05 + rng.random() * 0.5)
        except httpx.TimeoutException:
            pass
        finally:
            h.close()
        return stream

    started = time.time()
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        kinds = list(pool.map(one, range(n)))
    return {"streamed": sum(kinds), "collected": n - sum(kinds), "wall_s": time.time() - started}


def turns():
    """A conversation streamed turn by turn, each reply sent back with the next message (what
    the chat page does): each turn's content, reasoning and usage."""
    c = client()
    msgs, out = [], []
    for text in ARGS["messages"]:
        msgs.append({"role": "user", "content": text})
        content, reasoning, finish, usage, _, _ = chat_stream(
            c, model=model_id(), messages=msgs, stream_options={"include_usage": True}, **ARGS["settings"]
        )
        msgs.append({"role": "assistant", "content": content})
        out.append({"content": content, "reasoning": reasoning, "finish": finish,
                    "completion_tokens": usage.completion_tokens})
    return {"turns": out}


def predictions():
    """Predicted Outputs: a reply with `prediction` equals the reply without it (greedy; an
    exact, an edited and an unrelated prediction; streamed and not), and usage counts the
    prediction's accepted and rejected tokens; a bad prediction is a 400."""
    c = client()
    msgs = [{"role": "user", "content": ARGS["prompt"]}]
    greedy = dict(model=model_id(), messages=msgs, temperature=0, max_tokens=ARGS["max_tokens"])
    plain = c.chat.completions.create(**greedy)
    text = plain.choices[0].message.content
    d = plain.usage.completion_tokens_details
    assert d.accepted_prediction_tokens == 0 and d.rejected_prediction_tokens == 0, d
    words = text.split(" ")
    edited = " ".join(w if i % 4 != 2 else "banana" for i, w in enumerate(words))
    out = {"text": text, "completion_tokens": plain.usage.completion_tokens}
    for name, pred in [("exact", text), ("edited", edited), ("unrelated", ARGS["unrelated"]),
                       ("parts", [{"type": "text", "text": text}])]:
        r = c.chat.completions.create(**greedy, prediction={"type": "content", "content": pred})
        got = r.choices[0].message.content
        assert got == text, (name, got, text)
        assert r.usage.completion_tokens == plain.usage.completion_tokens, (name, r.usage)
        d = r.usage.completion_tokens_details
        out[name] = {"accepted": d.accepted_prediction_tokens, "rejected": d.rejected_prediction_tokens}
    s_text, _, _, s_usage, _, _ = chat_stream(
        c, **greedy, prediction={"type": "content", "content": text},
        stream_options={"include_usage": True})
    assert s_text == text, (s_text, text)
    out["streamed"] = {"accepted": s_usage.completion_tokens_details.accepted_prediction_tokens}
    for bad in [{"type": "audio", "content": "x"}, {"type": "content", "content": [{"type": "image_url"}]},
                {"type": "content"}]:
        try:
            c.chat.completions.create(**greedy, prediction=bad)
            raise AssertionError(f"accepted {bad}")
        except openai.BadRequestError as e:
            assert e.status_code == 400, e
    return out


if __name__ == "__main__":
    print(json.dumps(globals()[SCENARIO]()))
