"""Structured outputs through the real `openai` client, checked with the real `jsonschema`
validator (both pinned in scripts/test.sh's venv). Same calling convention as serve_client.py:

    python structured_client.py BASE_URL SCENARIO [JSON_ARGS]
"""

import concurrent.futures
import json
import re
from typing import List, Literal, Optional

import jsonschema
import openai
import pydantic

from serve_client import ARGS, SCENARIO, chat_stream, client, expect, model_id, no_markup

# Twenty schemas: nested objects, enums, arrays, required fields, bounded numbers, strings with
# patterns and lengths. Strings and arrays are bounded so that a small model's reply ends; so
# are numbers' digits (integers, or a multipleOf): no grammar can bound a JSON fraction's
# length, and a 135M model greedily writes 1.0000… until the token limit.
SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20}}, "required": ["name"],
     "additionalProperties": False},
    {"type": "object", "properties": {"age": {"type": "integer", "minimum": 0, "maximum": 120}},
     "required": ["age"], "additionalProperties": False},
    {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}}, "required": ["color"],
     "additionalProperties": False},
    {"type": "object", "properties": {"ok": {"type": "boolean"}, "note": {"type": "string", "maxLength": 12}},
     "required": ["ok", "note"], "additionalProperties": False},
    {"type": "object", "properties": {"items": {"type": "array", "items": {"type": "string", "maxLength": 10},
                                                "minItems": 1, "maxItems": 3}},
     "required": ["items"], "additionalProperties": False},
    {"type": "object", "properties": {"point": {"type": "object", "properties": {
        "x": {"type": "integer", "minimum": -10, "maximum": 10}, "y": {"type": "integer", "minimum": -10, "maximum": 10}},
        "required": ["x", "y"], "additionalProperties": False}}, "required": ["point"], "additionalProperties": False},
    {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}},
     "required": ["code"], "additionalProperties": False},
    {"type": "object", "properties": {"word": {"type": "string", "minLength": 3, "maxLength": 5}},
     "required": ["word"], "additionalProperties": False},
    {"type": "object", "properties": {"score": {"type": "integer", "minimum": 0, "maximum": 10}},
     "required": ["score"], "additionalProperties": False},
    {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 9}, "minItems": 2, "maxItems": 4},
    {"type": "object", "properties": {"user": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 15}, "email": {"type": "string", "pattern": "^[a-z]{1,8}@[a-z]{1,8}\\.com$"}},
        "required": ["name", "email"], "additionalProperties": False},
        "active": {"type": "boolean"}}, "required": ["user", "active"], "additionalProperties": False},
    {"type": "object", "properties": {"status": {"const": "done"}, "count": {"type": "integer", "minimum": 0, "maximum": 99}},
     "required": ["status", "count"], "additionalProperties": False},
    {"type": "object", "properties": {"value": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9},
                                                           {"type": "string", "maxLength": 4}]}},
     "required": ["value"], "additionalProperties": False},
    {"type": "object", "properties": {"maybe": {"type": ["string", "null"], "maxLength": 8}},
     "required": ["maybe"], "additionalProperties": False},
    {"type": "object", "properties": {"matrix": {"type": "array", "maxItems": 2, "minItems": 1, "items": {
        "type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 5}, "minItems": 1, "maxItems": 2}}},
     "required": ["matrix"], "additionalProperties": False},
    {"type": "object", "properties": {"day": {"enum": ["mon", "tue", "wed"]}, "hour": {"type": "integer", "minimum": 0, "maximum": 23},
                                      "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2}},
     "required": ["day", "hour", "tags"], "additionalProperties": False},
    {"type": "object", "properties": {"temperature": {"type": "integer", "minimum": -50, "exclusiveMaximum": 50},
                                      "unit": {"enum": ["C", "F"]}}, "required": ["temperature", "unit"], "additionalProperties": False},
    {"type": "object", "properties": {"title": {"type": "string", "minLength": 1, "maxLength": 16},
                                      "pages": {"type": "integer", "minimum": 1, "maximum": 999}},
     "required": ["title", "pages"], "additionalProperties": False},
    {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "object", "properties": {
        "c": {"type": "string", "enum": ["x", "y"]}}, "required": ["c"], "additionalProperties": False}},
        "required": ["b"], "additionalProperties": False}}, "required": ["a"], "additionalProperties": False},
    {"type": "object", "properties": {"id": {"type": "integer", "minimum": 1000, "maximum": 9999},
                                      "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                                      "ratio": {"type": "number", "minimum": 0, "maximum": 10, "multipleOf": 0.5}},
     "required": ["id", "zip", "ratio"], "additionalProperties": False},
]


def json_schemas():
    """Every schema, greedy and sampled, gives content that validates; streamed equals whole."""
    c = client()
    m = model_id()
    assert len(SCHEMAS) == 20
    for s in SCHEMAS:
        jsonschema.Draft202012Validator.check_schema(s)

    def one(job):
        i, temperature = job
        s = SCHEMAS[i]
        kw = dict(model=m, max_tokens=ARGS.get("max_tokens", 300), temperature=temperature, seed=i,
                  messages=[{"role": "user", "content": "Reply with JSON for a small example record."}],
                  response_format={"type": "json_schema",
                                   "json_schema": {"name": f"s{i}", "schema": s, "strict": True}})
        r = c.chat.completions.create(**kw)
        ch = r.choices[0]
        assert ch.finish_reason == "stop", (i, temperature, ch)
        value = json.loads(ch.message.content)
        jsonschema.validate(value, s)
        content, _, finish, _, _, _ = chat_stream(c, **kw)
        assert finish == "stop" and content == ch.message.content, (i, content, ch.message.content)
        return ch.message.content

    jobs = [(i, t) for i in range(len(SCHEMAS)) for t in (0.0, 1.0)]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(one, jobs))
    return {"replies": replies}


def other_formats():
    """json_object, a regex and a choice (vLLM's fields, both spellings), on chat and
    completions; the pydantic `parse` helper; bad values are 400s naming the field."""
    c = client()
    m = model_id()
    user = [{"role": "user", "content": "Give me some data."}]
    # Greedy must close its object; a sampled reply may run to max_tokens, and then (as OpenAI
    # documents) its JSON is cut off, so only a reply that stopped by itself must parse.
    for temperature, seed, max_tokens in ((0.0, None, 200), (1.0, 1, 60), (1.0, 2, 60), (1.0, 3, 60)):
        r = c.chat.completions.create(model=m, messages=user, max_tokens=max_tokens, temperature=temperature,
                                      seed=seed, response_format={"type": "json_object"})
        ch = r.choices[0]
        assert temperature > 0 or ch.finish_reason == "stop", r
        if ch.finish_reason == "stop":
            assert isinstance(json.loads(ch.message.content), dict), r
        else:
            assert ch.finish_reason == "length" and r.usage.completion_tokens == max_tokens, r
    rx = r"[A-Z][a-z]{2,6} [0-9]{1,3}"
    for extra in ({"structured_outputs": {"regex": rx}}, {"guided_regex": rx}):
        for temperature in (0.0, 1.0):
            r = c.chat.completions.create(model=m, messages=user, max_tokens=40, temperature=temperature,
                                          extra_body=extra)
            assert re.fullmatch(rx, r.choices[0].message.content), r
            r = c.completions.create(model=m, prompt="The answer is", max_tokens=40, temperature=temperature,
                                     extra_body=extra)
            assert re.fullmatch(rx, r.choices[0].text), r
    choices = ["alpha", "beta", "gamma delta"]
    for extra in ({"structured_outputs": {"choice": choices}}, {"guided_choice": choices}):
        r = c.chat.completions.create(model=m, messages=user, max_tokens=20, extra_body=extra)
        assert r.choices[0].message.content in choices, r
    grammar = 'start: "yes" | "no" | "maybe " NUM\nNUM: /[0-9]/'
    r = c.completions.create(model=m, prompt="Well,", max_tokens=20, extra_body={"structured_outputs": {"grammar": grammar}})
    assert re.fullmatch(r"yes|no|maybe [0-9]", r.choices[0].text), r
    r = c.completions.create(model=m, prompt="Data:", max_tokens=200,
                             extra_body={"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMAS[5]}}})
    jsonschema.validate(json.loads(r.choices[0].text), SCHEMAS[5])

    class Pet(pydantic.BaseModel):
        name: str = pydantic.Field(max_length=12)
        kind: Literal["cat", "dog"]
        age: int = pydantic.Field(ge=0, le=30)
        toys: List[Literal["ball", "bone", "rope"]] = pydantic.Field(max_length=2)
        owner: Optional[str] = pydantic.Field(default=None, max_length=10)

    p = c.chat.completions.parse(model=m, messages=[{"role": "user", "content": "Describe a pet."}],
                                 max_tokens=300, response_format=Pet)
    pet = p.choices[0].message.parsed
    assert isinstance(pet, Pet), p
    # Bad values: 400 naming the field.
    bad = [
        ({"response_format": {"type": "xml"}}, "response_format"),
        ({"response_format": {"type": "json_schema"}}, "response_format"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": 3}}}, "response_format"),
        ({"response_format": "json"}, "response_format"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "(("}}}}, "response_format"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer", "minimum": 5, "maximum": 2}}}}, "response_format"),
        ({"structured_outputs": {"regex": 5}}, "structured_outputs.regex"),
        ({"structured_outputs": {"yaml": "x"}}, "structured_outputs.yaml"),
        ({"guided_choice": []}, "guided_choice"),
        ({"guided_regex": "(("}, "structured_outputs"),
        ({"guided_json": {"type": "object"}, "guided_regex": "a"}, "structured_outputs"),
        ({"tool_choice": "sometimes"}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [{"type": "function", "function": {"name": "f", "strict": "yes"}}]}, "tools"),
    ]
    for extra, field in bad:
        e = expect(400, lambda: c.chat.completions.create(model=m, messages=user, max_tokens=5, extra_body=extra))
        assert e.get("param") == field, (extra, e)
    return {"pet": pet.model_dump()}


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "strict": True,
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {
        "zone": {"type": "string", "pattern": "^[A-Z]{3}$"}}, "required": ["zone"], "additionalProperties": False}}}


def forced_tools():
    """tool_choice required and named: a call of an offered (the named) tool, arguments valid
    against its schema, streamed and not, greedy and sampled."""
    c = client()
    m = model_id()
    tools = [WEATHER, TIME]
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    user = [{"role": "user", "content": "What's the weather in Paris?"}]
    seen = []
    for choice in ("required", {"type": "function", "function": {"name": "get_time"}},
                   {"type": "function", "function": {"name": "get_weather"}}):
        for temperature in (0.0, 1.0):
            kw = dict(model=m, messages=user, tools=tools, tool_choice=choice, max_tokens=200,
                      temperature=temperature, seed=3)
            r = c.chat.completions.create(**kw)
            ch = r.choices[0]
            assert ch.finish_reason == "tool_calls" and ch.message.tool_calls, ch
            for call in ch.message.tool_calls:
                if isinstance(choice, dict):
                    assert call.function.name == choice["function"]["name"], call
                jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])
                seen.append(call.function.name)
            no_markup(ch.message.content)
            _, _, finish, _, _, calls = chat_stream(c, **kw)
            assert finish == "tool_calls", finish
            assert [(x["name"], x["arguments"]) for x in calls] == \
                [(t.function.name, t.function.arguments) for t in ch.message.tool_calls], calls
    e = expect(400, lambda: c.chat.completions.create(
        model=m, messages=user, tools=tools, max_tokens=5,
        tool_choice={"type": "function", "function": {"name": "nope"}}))
    assert e.get("param") == "tool_choice", e
    return {"calls": seen}


# A random model picks among the headers the grammar allows (another analysis, say) at random:
# the tests force the reasoning and the channel, and the grammar does the rest.
ANALYSIS = "<|channel|>analysis<|message|>The user wants JSON. I will think freely here: {{{ not json.<|end|><|start|>assistant"
FINAL = ANALYSIS + "<|channel|>final"
CALL = ANALYSIS + "<|channel|>commentary to=functions."


def harmony_json():
    """gpt-oss: the final answer validates against the schema (its format is written in the
    developer message); the reasoning before it is free (forced here, text no schema allows:
    the grammar takes it), and sampled reasoning is never cut short by the constraint."""
    c = client()
    m = model_id()
    user = [{"role": "user", "content": "Give me a record."}]
    out = []
    for i in (1, 5, 6, 11, 15):
        s = SCHEMAS[i]
        for temperature in (0.0, 1.0):
            kw = dict(model=m, messages=user, max_tokens=300, temperature=temperature, seed=i,
                      response_format={"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": s}},
                      extra_body={"x_inferno_force_prefix": FINAL, "x_inferno_prompt_ids": True})
            r = c.chat.completions.create(**kw)
            ch = r.choices[0]
            assert ch.finish_reason == "stop", ch
            jsonschema.validate(json.loads(ch.message.content), s)
            extra = ch.message.model_extra or {}
            assert extra.get("reasoning_content", "").startswith("The user wants JSON. I will think freely"), extra
            no_markup(ch.message.content, extra.get("reasoning_content"))
            out.append(ch.message.content)
            ids = r.model_extra["x_inferno_prompt_ids"]
    # Unforced: the analysis the model samples is not constrained (it may run to the limit).
    r = c.chat.completions.create(model=m, messages=user, max_tokens=40, temperature=1.0, seed=1,
                                  response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMAS[1]}})
    ch = r.choices[0]
    no_markup(ch.message.content, (ch.message.model_extra or {}).get("reasoning_content"))
    # Forced tool call after the analysis: the header is forced, the arguments follow the schema.
    for choice in ("required", {"type": "function", "function": {"name": "get_time"}}):
        r = c.chat.completions.create(model=m, messages=user, max_tokens=200, tools=[WEATHER, TIME], tool_choice=choice,
                                      extra_body={"x_inferno_force_prefix": CALL})
        ch = r.choices[0]
        assert ch.finish_reason == "tool_calls" and len(ch.message.tool_calls) == 1, ch
        call = ch.message.tool_calls[0]
        if isinstance(choice, dict):
            assert call.function.name == "get_time", call
        schema = (WEATHER if call.function.name == "get_weather" else TIME)["function"]["parameters"]
        jsonschema.validate(json.loads(call.function.arguments), schema)
    return {"replies": out, "prompt_ids": ids}


if __name__ == "__main__":
    print(json.dumps(globals()[SCENARIO]()))
