"""The official `openai` client talks to leanstreamd over its Unix socket (httpx UDS transport).
Run by tools/tests/daemon.rs: python3 tools/tests/openai_client.py SOCKET. Prints 'openai client: N passed'."""
import sys

import httpx
import openai

sock = sys.argv[1]
client = openai.OpenAI(
    base_url="http://localhost/v1",
    api_key="unused",
    http_client=httpx.Client(transport=httpx.HTTPTransport(uds=sock)),
    max_retries=0,
)
passed = 0

r = client.completions.create(model="any", prompt="Once upon a time", max_tokens=20, temperature=0)
assert r.choices[0].text, r
assert r.usage.completion_tokens == 20, r.usage
assert r.choices[0].finish_reason == "length", r
passed += 1

pieces = [c.choices[0].text for c in client.completions.create(
    model="any", prompt="Once upon a time", max_tokens=20, temperature=0, stream=True)]
assert "".join(pieces) == r.choices[0].text, (pieces, r.choices[0].text)
passed += 1

c = client.chat.completions.create(
    model="any", messages=[{"role": "user", "content": "Tell me a story."}], max_tokens=16, temperature=0)
assert c.choices[0].message.role == "assistant" and c.choices[0].message.content, c
passed += 1

chunks = client.chat.completions.create(
    model="any", messages=[{"role": "user", "content": "Tell me a story."}], max_tokens=16, temperature=0,
    stream=True)
text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
assert text == c.choices[0].message.content, (text, c.choices[0].message.content)
passed += 1

models = client.models.list()
assert models.data and models.data[0].id, models
print(f"openai client: {passed} passed, 0 failed")
