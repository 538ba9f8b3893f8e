"""GGUF smoke without Docker: Gemma 3 270M Q4_K_M through `serve` from the CPU tier.

Assembles and checks the model, serves it on 127.0.0.1, waits for the readiness
file, runs `probe` and `status`, asks for one greedy completion, then stops the
server (`--keep` leaves it running and prints how to stop it). Exit 0 only when
every step passed.

    .venv/bin/python checks/gguf_cpu/smoke_gguf.py [--keep]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


from fixtures.serving import run_entrypoint, start_gemma  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", action="store_true", help="leave the server running")
    parser.add_argument("--timeout", type=float, default=1200)
    args = parser.parse_args()

    served, model = start_gemma("float32")
    ok = False
    try:
        try:
            served.wait_ready(args.timeout)
        except AssertionError as error:
            print(f"smoke-gguf: the server did not become ready: {error}", file=sys.stderr)
            return 1
        print(f"smoke-gguf: ready after {served.ready_after:.0f}s on 127.0.0.1:{served.port}")
        for command in ("probe", "status"):
            result = run_entrypoint(command, "--ready-file", str(served.ready))
            print(f"--- {command} (exit {result.returncode}):\n{result.stdout.strip()}")
            if result.returncode != 0:
                print(result.stderr, file=sys.stderr)
                return 1
        answer = served.post(
            "/v1/completions",
            {"model": str(model), "prompt": "The capital of France is", "max_tokens": 12,
             "temperature": 0},
        )  # fmt: skip
        text = answer["choices"][0]["text"]
        print(f"--- completion: {text!r}")
        ok = answer["usage"]["completion_tokens"] > 0 and bool(text.strip())
        return 0 if ok else 1
    finally:
        if args.keep and ok:
            pid = served.proc.pid
            print(f"smoke-gguf: left running (pid {pid}); stop with: kill -TERM -{pid}")
        else:
            served.terminate(120)


if __name__ == "__main__":
    sys.exit(main())
