"""The /metrics reader, the wedge watchdog, speculative decoding, the startup history,
the status summary and the new settings' ranges (in-process only)."""

from __future__ import annotations

import threading

import pytest

from entrypoint.argv import settings
from entrypoint.errors import ConfigError
from entrypoint.watch import metrics, startup_history, status_summary, watcher

# As vLLM 0.32's prometheus_client writes them (names, labels, a histogram's _count).
METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="m"}} {running}
vllm:num_requests_waiting{{engine="0",model_name="m"}} 0.0
vllm:kv_cache_usage_perc{{engine="0",model_name="m"}} 0.25
vllm:generation_tokens_total{{engine="0",model_name="m"}} {tokens}
vllm:generation_tokens_created{{engine="0",model_name="m"}} 1.7e+09
vllm:prompt_tokens_total{{engine="0",model_name="m"}} 40.0
vllm:iteration_tokens_total_count{{engine="0",model_name="m"}} {steps}
vllm:iteration_tokens_total_bucket{{engine="0",le="+Inf",model_name="m"}} {steps}
"""
SPEC = """\
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 24.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 72.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 22.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 8.0
"""


def sample(running: float = 1, tokens: float = 10, steps: float = 5) -> dict[str, float]:
    return metrics.parse(METRICS.format(running=running, tokens=tokens, steps=steps))


def test_parse_sums_label_sets_and_skips_comments() -> None:
    text = METRICS.format(running=1, tokens=10, steps=5) + (
        'vllm:num_requests_running{engine="1",model_name="m"} 2.0\nbad line\nx NaN\n')
    values = metrics.parse(text)
    assert values[metrics.RUNNING] == 3.0
    assert values["vllm:generation_tokens_total"] == 10.0
    assert "x" not in values and not any(k.startswith("#") for k in values)


class Watched:
    """A WedgeWatch fed by its QuietClock, as the watcher feeds it."""

    def __init__(self, seconds: float) -> None:
        self.watch, self.clock = metrics.WedgeWatch(seconds), metrics.QuietClock()

    def update(self, values: dict[str, float], now: float) -> str | None:
        return self.watch.update(values, self.clock.update(values, now))


def test_wedge_needs_running_requests_and_no_progress_for_the_window() -> None:
    watch = Watched(30)
    assert watch.update(sample(tokens=10), 0) is None
    assert watch.update(sample(tokens=11), 20) is None  # a token: progress
    assert watch.update(sample(tokens=11), 49) is None  # 29 s without
    reason = watch.update(sample(tokens=11), 50)
    assert reason == ("engine wedged: 1 request(s) running and no engine progress "
                      "(tokens, KV cache, finished requests) for 30 s")
    assert watch.update(sample(tokens=12), 51) is None  # it moved again


def test_idle_or_prefilling_engines_are_not_wedged() -> None:
    watch = Watched(30)
    for t in range(0, 100, 10):  # idle: nothing runs, nothing moves
        assert watch.update(sample(running=0), t) is None
    kv = sample()
    for t in range(100, 200, 10):  # a long prefill: only the KV-cache use moves
        kv["vllm:kv_cache_usage_perc"] += 0.01
        assert watch.update(dict(kv), t) is None


def test_quiet_clock_counts_from_the_last_change_busy_or_idle() -> None:
    clock = metrics.QuietClock()
    assert clock.update(sample(running=0), 100) == 0
    assert clock.update(sample(running=0), 130) == 30  # idle: nothing moves
    assert clock.update(sample(running=1), 131) == 0  # a request arrived
    assert clock.update(sample(running=1, tokens=11), 140) == 0
    assert clock.update(sample(running=1, tokens=11), 145) == 5


class HeldCheck:
    """GenerationCheck's request thread held or ended on the test's word (in-process:
    the real request against vLLM is in test_entrypoint_vllm_watchdog)."""

    def __init__(self, interval: float = 30, timeout: float = 5) -> None:
        config = watcher.WatchConfig(pid=1, base_url="http://127.0.0.1:9", ready_file="r",
                                     status_file="s", argv_digest="d",
                                     generation_check_interval=interval,
                                     generation_check_timeout=timeout)
        self.check = watcher.GenerationCheck(config, None)
        self.check.last = 0.0
        self.started = 0
        self.release = threading.Event()
        self.outcome: str | None = None  # None: answered; "timeout"; or a failure
        self.check._check = self._run  # type: ignore[method-assign]

    def _run(self) -> None:
        self.started += 1
        self.release.wait(10)
        if self.outcome == "timeout":
            self.check.timed_out = True
        else:
            self.check.failure = self.outcome

    def end(self, outcome: str | None) -> None:
        self.outcome = outcome
        self.release.set()
        assert self.check.thread is not None
        self.check.thread.join(10)
        self.release.clear()


def test_a_late_check_behind_progressing_work_is_not_a_failure() -> None:
    held = HeldCheck(timeout=5)
    assert held.check.tick(idle=True, now=30, quiet=20) is None
    assert held.started == 1
    # Real requests came in after it: the check's token queues behind them.
    assert held.check.tick(idle=False, now=40, quiet=0.5) is None  # 10 s late, busy
    assert held.check.tick(idle=False, now=44, quiet=4.9) is None
    # The engine moved nothing for the timeout as well: now it counts.
    assert held.check.tick(idle=False, now=45, quiet=5) == (
        "generation check: no token within 5 s")
    held.end(None)  # the token came after all
    assert held.check.tick(idle=False, now=46, quiet=0) is None


def test_a_check_that_timed_out_while_busy_is_retried_once_idle() -> None:
    held = HeldCheck(interval=30, timeout=5)
    held.check.tick(idle=True, now=30, quiet=20)
    held.end("timeout")
    assert held.check.tick(idle=False, now=36, quiet=1) is None  # busy, progressing
    assert held.started == 1
    assert held.check.tick(idle=True, now=37, quiet=0.5) is None  # idle: asked again
    assert held.started == 2  # well before the 30 s interval
    held.end(None)
    assert held.check.tick(idle=True, now=38, quiet=0) is None


def test_a_stuck_idle_engine_stays_failed_until_a_check_answers() -> None:
    held = HeldCheck(interval=30, timeout=5)
    held.check.tick(idle=True, now=30, quiet=20)
    reason = "generation check: no token within 5 s"
    assert held.check.tick(idle=True, now=36, quiet=26) == reason  # late and quiet
    held.end("timeout")
    assert held.check.tick(idle=True, now=40, quiet=30) == reason
    assert held.started == 1  # a stuck engine is not asked again before the interval
    assert held.check.tick(idle=True, now=60, quiet=50) == reason  # the next one runs...
    assert held.started == 2
    held.end(None)  # ...and answers
    assert held.check.tick(idle=True, now=61, quiet=0) is None


def test_a_check_due_sooner_than_the_timeout_keeps_a_stuck_engine_failed() -> None:
    held = HeldCheck(interval=3, timeout=5)
    held.check.tick(idle=True, now=30, quiet=20)
    held.end("timeout")  # its request timed out on its own clock
    reason = "generation check: no token within 5 s"
    assert held.check.tick(idle=True, now=35.5, quiet=25.5) == reason
    assert held.started == 2  # the next check is due, and the reason stands meanwhile
    assert held.check.tick(idle=True, now=36, quiet=26) == reason


def test_other_failures_of_the_check_count_at_once() -> None:
    held = HeldCheck(interval=30, timeout=5)
    held.check.tick(idle=True, now=30, quiet=20)
    held.end("generation check: HTTP 500")
    assert held.check.tick(idle=False, now=31, quiet=0) == "generation check: HTTP 500"


def test_speculative_acceptance() -> None:
    assert metrics.speculative(sample()) is None
    spec = metrics.speculative(metrics.parse(SPEC))
    assert spec == {"drafts": 24, "draft_tokens": 72, "accepted_tokens": 22,
                    "acceptance_rate": 0.3056, "mean_accepted_length": 1.917}
    assert status_summary.speculative_line(spec) == (
        "speculative decoding: acceptance 30.6 % (22 of 72 draft tokens), "
        "mean accepted length 1.92")
    none_yet = metrics.speculative({metrics.DRAFTS: 0, metrics.DRAFT_TOKENS: 0})
    assert none_yet is not None and none_yet["acceptance_rate"] is None


def test_history_gives_an_eta(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = startup_history.path_for(str(tmp_path / "status.json"))
    assert startup_history.load(path) is None
    startup_history.save(path, [{"step": "validating", "at": 100.0, "seconds": 5.0},
                                {"step": "serving", "at": 520.0, "seconds": 0.0}],
                         "sha256:a", ready_at=520.0)
    history = startup_history.load(path)
    assert history is not None and history["total_s"] == 420.0
    eta = startup_history.estimate(history, started=1000.0, now=1100.0, argv_digest="sha256:a")
    assert eta == {"last_total_s": 420.0, "eta_s": 320.0, "same_config": True}
    late = startup_history.estimate(history, 1000.0, 2000.0, "sha256:b")
    assert late == {"last_total_s": 420.0, "eta_s": 0.0, "same_config": False}
    status = {"phase": "starting", "eta": eta}
    assert status_summary.eta_line(status) == (
        "expected ready in about 5.3 min (the last start took 7.0 min)")


def test_summary_of_a_loading_start() -> None:
    status = {
        "phase": "starting", "step": "loading weights", "pid": 7, "url": "http://h:8000",
        "steps": [{"step": "validating", "at": 0.0, "seconds": 2.0},
                  {"step": "loading weights", "at": 2.0, "seconds": 60.0}],
        "loading": {"done_bytes": 100 * 2**30, "total_bytes": 400 * 2**30, "percent": 25,
                    "ranks": 8, "eta_s": 180.0},
    }
    text = status_summary.summarize(status, now=62.0)
    assert text.splitlines()[0] == (
        "starting: loading weights 100.00 of 400.00 GiB (25%, 8 rank(s)), about 3.0 min left")
    assert "  steps: validating 2 s, loading weights 60 s" in text


@pytest.mark.parametrize(("name", "value", "words"), [
    (settings.WEDGE_SECONDS, "-1", "must be a number from 0 to 86400"),
    (settings.WEDGE_SECONDS, "nan", "must be a number from 0 to 86400"),
    (settings.WEDGE_SECONDS, "0.5", "must be 0 (off) or at least SERVE_HEALTH_INTERVAL"),
    (settings.GENERATION_CHECK_INTERVAL, "1", "must be 0 (off) or at least"),
    (settings.GENERATION_CHECK_TIMEOUT, "0", "must be a number from 1 to 3600"),
])
def test_watchdog_settings_are_range_checked(name: str, value: str, words: str) -> None:
    with pytest.raises(ConfigError) as error:
        settings.watch_settings({name: value})
    assert any(name in p and words in p for p in error.value.problems), error.value.problems


def test_watchdog_defaults() -> None:
    watch = settings.watch_settings({})
    assert watch.wedge_seconds == settings.DEFAULT_WEDGE_SECONDS == 300
    assert watch.generation_check_interval == 0  # off
    assert settings.watch_settings({settings.WEDGE_SECONDS: "0"}).wedge_seconds == 0
