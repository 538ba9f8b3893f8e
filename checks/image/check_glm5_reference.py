"""`make e2e`: a served tiny GLM-5 gives the greedy ids of its build-time reference.

    python3 checks/image/check_glm5_reference.py URL MODEL REFERENCE.json

REFERENCE.json is the smoke-glm5 image's /opt/glm5/reference.json
(fixtures/glm5_served.py: transformers on gguf-py's dequantization of the
image's GGUF). Each prompt goes as token ids; the reply's ids must equal the
reference's. Standard library only: it runs on the host, outside any venv.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.request

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def complete(url: str, model: str, prompt: list[int], tokens: int) -> list[int]:
    body = {"model": model, "prompt": prompt, "max_tokens": tokens, "min_tokens": tokens,
            "temperature": 0, "return_token_ids": True}
    request = urllib.request.Request(f"{url}/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with _OPENER.open(request, timeout=120) as response:
        return list(json.load(response)["choices"][0]["token_ids"])


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    url, model, path = argv
    with open(path) as f:
        ref = json.load(f)
    failed = 0
    for prompt, want in zip(ref["prompts"], ref["tokens"], strict=True):
        start = time.monotonic()
        got = complete(url, model, prompt, ref["new_tokens"])
        took = time.monotonic() - start
        same = got == want
        failed += not same
        print(f"{len(prompt):>3}-token prompt: {'same ids' if same else 'DIFFERENT ids'} "
              f"({len(got)} tokens in {took:.2f} s)")
        if not same:
            print(f"  served    {got}\n  reference {want}")
    print(f"{len(ref['prompts']) - failed} of {len(ref['prompts'])} prompts gave the reference ids")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
