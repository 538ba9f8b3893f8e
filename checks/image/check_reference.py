"""`make e2e`: a served tiny model gives the greedy ids of its build-time reference.

    python3 checks/image/check_reference.py URL MODEL REFERENCE.json [--drafter NAME]

REFERENCE.json is a smoke image's build-time reference: smoke-glm5's
/opt/glm5/reference.json (fixtures/glm5_served.py: transformers on gguf-py's
dequantization of the image's GGUF) or smoke-dflash's /opt/dflash/reference.json
(fixtures/dflash_served.py: transformers' target, and z-lab's greedy DFlash loop with
each drafter). Each prompt goes as token ids, one after the other; the reply's ids
must equal the reference's. With --drafter, vLLM's spec-decode counters (/metrics)
must then equal the ones the reference gives that drafter, on a server that has
served nothing else, and the last line printed is the acceptance line that
`frontier-serve status` will show. Standard library only: it runs on the host,
outside any venv.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
import urllib.request

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "num_accepted_tokens_per_pos")


def complete(url: str, model: str, prompt: list[int], tokens: int) -> list[int]:
    body = {"model": model, "prompt": prompt, "max_tokens": tokens, "min_tokens": tokens,
            "temperature": 0, "return_token_ids": True}
    request = urllib.request.Request(f"{url}/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with _OPENER.open(request, timeout=120) as response:
        return list(json.load(response)["choices"][0]["token_ids"])


def spec_counters(url: str) -> dict:
    """vLLM's spec-decode counters (Prometheus text of /metrics), summed over labels."""
    with _OPENER.open(f"{url}/metrics", timeout=30) as response:
        text = response.read().decode()
    found: dict = {"num_accepted_tokens_per_pos": {}}
    for line in text.splitlines():
        m = re.match(r'vllm:spec_decode_(\w+?)_total(\{[^}]*\})? ([0-9.e+]+)$', line)
        if not m or m.group(1) not in COUNTERS:
            continue
        name, value = m.group(1), int(float(m.group(3)))
        if name == "num_accepted_tokens_per_pos":
            pos = int(re.search(r'position="(\d+)"', m.group(2) or "").group(1))  # type: ignore[union-attr]
            found[name][pos] = found[name].get(pos, 0) + value
        else:
            found[name] = found.get(name, 0) + value
    per_pos = found["num_accepted_tokens_per_pos"]
    found["num_accepted_tokens_per_pos"] = [per_pos[p] for p in sorted(per_pos)]
    return found


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="check_reference.py", description=__doc__.splitlines()[0])
    ap.add_argument("url")
    ap.add_argument("model")
    ap.add_argument("reference")
    ap.add_argument("--drafter", help="check the spec-decode counters of this reference drafter")
    args = ap.parse_args(argv)
    with open(args.reference) as f:
        ref = json.load(f)
    failed = 0
    for prompt, want in zip(ref["prompts"], ref["tokens"], strict=True):
        start = time.monotonic()
        got = complete(args.url, args.model, prompt, ref["new_tokens"])
        took = time.monotonic() - start
        same = got == want
        failed += not same
        print(f"{len(prompt):>3}-token prompt: {'same ids' if same else 'DIFFERENT ids'} "
              f"({len(got)} tokens in {took:.2f} s)")
        if not same:
            print(f"  served    {got}\n  reference {want}")
    print(f"{len(ref['prompts']) - failed} of {len(ref['prompts'])} prompts gave the reference ids")
    if args.drafter is None:
        return 1 if failed else 0
    want = {k.removeprefix("spec_decode_"): v
            for k, v in ref["drafters"][args.drafter]["counters"].items()}
    got = spec_counters(args.url)
    if got != want:
        print(f"spec-decode counters {got}\n  reference gives {want}")
        return 1
    accepted, proposed = want["num_accepted_tokens"], want["num_draft_tokens"]
    print(f"spec-decode counters equal the reference's for {args.drafter}")
    print(f"speculative decoding: acceptance {100 * accepted / proposed:.1f} % "
          f"({accepted} of {proposed} draft tokens)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
