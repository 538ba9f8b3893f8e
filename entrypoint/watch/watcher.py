"""Readiness watcher: a small stdlib-only process that outlives the exec into vLLM.

`serve` starts it (`python -m entrypoint.watch.watcher CONFIG_JSON`) just before it execs
vLLM, so vLLM keeps the entrypoint's pid and is the watcher's parent. The watcher
polls /health and /v1/models, keeps the readiness file and status JSON current,
and ends as soon as vLLM ends (pidfd, or polling the pid where pidfds are missing).
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from entrypoint.argv import settings
from entrypoint.watch import (
    load_progress,
    metrics,
    node_heartbeat,
    node_links,
    stall,
    startup_history,
)
from entrypoint.watch.log_capture import WARM_UP_FOLLOWS, LogTail, milestone, model_runner
from entrypoint.watch.process_tree import descendants, stop_leftovers
from entrypoint.watch.statusfile import (
    describe_wait_status,
    pid_alive,
    process_start,
    remove_quietly,
    write_json_atomic,
    write_ready,
    zombie_exit_status,
)
from entrypoint.watch.steps import (
    CAPTURING,
    KV_CACHE,
    SERVING,
    STARTING_VLLM,
    WARMING_UP,
    Steps,
)

# validating: `serve` checks the configuration (no vLLM yet); the rest are the watcher's.
VALIDATING = "validating"
STARTING, READY, UNHEALTHY, EXITED = "starting", "ready", "unhealthy", "exited"


@dataclass
class WatchConfig:
    pid: int
    base_url: str
    ready_file: str
    status_file: str
    argv_digest: str
    interval: float = 2.0
    timeout: float = 2.0
    failures: int = 3
    stale_after: float = 15.0
    # Known trouble found before the exec (e.g. a missing model folder), quoted in the
    # status if vLLM dies before it is ready: vLLM's own message is only in its log.
    hints: list[str] = field(default_factory=list)
    # Where the plugin's loading ranks report bytes loaded (entrypoint/watch/load_progress.py).
    load_progress_dir: str | None = None
    # The steps `serve` went through before the exec (validating, preflight).
    steps: list[dict[str, Any]] = field(default_factory=list)
    # vLLM's log as JSON lines (entrypoint/start/vllm_logging.py), or None when not captured;
    # log_capture_off says why not.
    log_file: str | None = None
    log_level: str = "INFO"
    log_capture_off: str | None = None
    # CUDA graphs follow the KV cache (a CUDA build without --enforce-eager).
    cuda_graphs: bool = False
    # Requests running and no engine progress for this long: unhealthy (0: off).
    wedge_seconds: float = 0.0
    # An idle server is asked for one token every this many seconds (0: off).
    generation_check_interval: float = 0.0
    generation_check_timeout: float = 60.0
    history_file: str | None = None
    # A start with no progress past its step's limit is ended (entrypoint/watch/stall.py):
    # SERVE_STALL_* name -> seconds (0: off); the grace vLLM gets to exit on its own.
    stall: dict[str, float] = field(default_factory=lambda: dict(settings.DEFAULT_STALL))
    stall_grace: float = 20.0
    start_limit: float = settings.DEFAULT_START_LIMIT
    # Multi-node: role, node rank, node count, leader (entrypoint/argv/nodes.py); None alone.
    node: dict[str, Any] | None = None

    @classmethod
    def from_json(cls, text: str) -> WatchConfig:
        return cls(**json.loads(text))

    def to_json(self) -> str:
        return json.dumps(self.__dict__, sort_keys=True)


@dataclass
class Tracker:
    """The phase machine. Pure apart from the two files it writes; tests drive it directly."""

    config: WatchConfig
    clock: Callable[[], float] = time.time
    phase: str = STARTING
    since: float = 0.0
    failures_in_row: int = 0
    ever_ready: bool = False
    last_error: str | None = None
    last_error_at: float | None = None  # the error stays after recovery; its time dates it
    reason: str | None = None
    exit_code: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    pid_start: str | None = field(init=False, default=None)
    steps: Steps = field(init=False)
    log: LogTail | None = field(init=False, default=None)
    speculative: dict[str, Any] | None = None
    runner: str | None = None  # "V1" or "V2": vLLM's model runner, from its log
    loading_start: tuple[float, int] | None = None  # (time, bytes) of the first progress seen
    history: dict[str, Any] | None = field(init=False, default=None)  # the last good start
    progress: stall.Progress = field(init=False)
    stall_reason: str | None = None  # set once a stalled start is being ended

    def __post_init__(self) -> None:
        self.since = self.clock()
        self.progress = stall.Progress(self.since)
        self.pid_start = process_start(self.config.pid)  # fixed for the pid's lifetime
        self.steps = Steps(self.config.steps)
        self.steps.enter(STARTING_VLLM, self.since)
        if self.config.log_file:
            self.log = LogTail(self.config.log_file)
        if self.config.history_file:  # read once: only this start's readiness rewrites it
            self.history = startup_history.load(self.config.history_file)

    def read_log(self) -> None:
        """vLLM's new log records: its milestones become steps."""
        if self.log is None:
            return
        for record in self.log.read():
            message = str(record.get("msg", ""))
            self.runner = self.runner or model_runner(message)
            found = milestone(message)
            if found is None:
                continue
            step, detail = found
            at = float(record.get("t") or self.clock())
            if step is None:
                if detail:
                    self.steps.note(detail)
            elif self.phase != READY:
                self.steps.enter(step, at, detail)
                if step == KV_CACHE and WARM_UP_FOLLOWS.search(message):
                    after = CAPTURING if self.config.cuda_graphs else WARMING_UP
                    self.steps.enter(after, at)

    def _enter(self, phase: str, reason: str | None) -> None:
        if phase != self.phase:
            self.phase, self.since = phase, self.clock()
        self.reason = reason

    def record(self, error: str | None, wedged: str | None = None) -> None:
        """Apply one health-check result (None means both endpoints answered), and what
        the watchdog found (`wedged`, only looked for while the endpoints answer)."""
        if error is None and wedged is not None:
            self.failures_in_row = 0
            if self.ever_ready:
                if self.phase != UNHEALTHY:
                    self.last_error, self.last_error_at = wedged, self.clock()
                self._enter(UNHEALTHY, wedged)
        elif error is None:
            self.failures_in_row = 0
            if not self.ever_ready:
                self.became_ready()
            self.ever_ready = True
            self._enter(READY, None)
        else:
            self.last_error, self.last_error_at = error, self.clock()
            self.failures_in_row += 1
            # Failures while loading are expected (nothing listens yet); only a server
            # that was ready can become unhealthy. Once unhealthy, the reason follows the
            # latest failure: a cause found a round later (a lost node, whose connections
            # or heartbeat take a moment to go) replaces the symptom seen first. A start
            # given up before it was ready (give_up) keeps its stall reason.
            unhealthy = self.phase == UNHEALTHY and self.ever_ready
            if unhealthy or (self.phase == READY and self.failures_in_row >= self.config.failures):
                self._enter(
                    UNHEALTHY, f"{self.failures_in_row} failed health checks in a row: {error}"
                )
        self.write()

    def became_ready(self) -> None:
        now = self.clock()
        self.steps.enter(SERVING, now)
        if self.config.history_file:
            try:
                startup_history.save(self.config.history_file, self.steps.durations(now),
                                     self.config.argv_digest, now)
            except OSError as exc:  # advice only: the next start just has no ETA
                self.extra["history_error"] = f"{self.config.history_file}: {exc.strerror or exc}"

    def exited(self, wait_status: int | None) -> None:
        code, words = describe_wait_status(wait_status)
        when = "after it was ready" if self.ever_ready else "before it became ready"
        reason = f"vLLM {words} {when}"
        if self.stall_reason:
            reason = f"{self.stall_reason}; {reason}"
        self.read_log()  # its last words are in the file by now
        error = self.log.error if self.log else None
        # A clean exit is not explained by an error: vLLM's SIGTERM shutdown can log an
        # EngineDeadError from the output handler as the engine core goes first. The
        # error stays in the status's "error" field.
        if error and code != 0:
            reason += f": {error}"
        if self.config.hints and not self.ever_ready:
            reason += f" ({'; '.join(self.config.hints)})"
        self.finish(code, reason)

    def finish(self, code: int | None, reason: str) -> None:
        self.exit_code = code
        self._enter(EXITED, reason)
        self.write()

    def _progress(self, loading: dict[str, Any] | None, now: float) -> dict[str, Any] | None:
        """How long the start has been still, against its step's limit; None once ready."""
        if self.ever_ready or self.phase not in (STARTING, UNHEALTHY):
            return None
        current = self.steps.entries[-1] if self.steps.entries else {}
        active = bool(loading and loading.get("done_bytes", 0) < loading.get("total_bytes", 0))
        key = (len(self.steps.entries), current.get("detail"),
               loading.get("done_bytes") if loading else None)
        quiet = self.progress.quiet(key, now)
        name, limit = stall.limit_for(current.get("step"), active, self.config.stall)
        started = self.steps.entries[0]["at"] if self.steps.entries else self.since
        return {"quiet_s": round(quiet, 1), "stall_limit_s": limit, "limit_setting": name,
                "step": current.get("step"), "start_s": round(now - started, 1),
                "start_limit_s": self.config.start_limit}

    def stalled(self) -> str | None:
        """Why this start is to be ended (no progress past its step's limit), or None."""
        if self.stall_reason:
            return None
        moving = self._progress(self._loading(), self.clock())
        if moving is None:
            return None
        return stall.reason(moving["step"], moving["quiet_s"], moving["limit_setting"],
                            moving["stall_limit_s"])

    def give_up(self, why: str) -> None:
        """A stalled start: readiness withdrawn and the reason kept until vLLM has gone."""
        self.stall_reason = why
        self._enter(UNHEALTHY, why)
        self.write()

    def stopped(self, why: str) -> None:
        """The watcher itself is going away: readiness can no longer be vouched for."""
        self._enter(UNHEALTHY, why)
        self.write()

    def _loading(self) -> dict[str, Any] | None:
        """Bytes loaded so far over all ranks, with an ETA from the rate since the first."""
        if not self.config.load_progress_dir or self.phase == READY:
            return None
        loading = load_progress.summary(self.config.load_progress_dir)
        if loading is None:
            return None
        now, done, total = self.clock(), loading["done_bytes"], loading["total_bytes"]
        if self.loading_start is None:
            self.loading_start = (now, done)
        began, first = self.loading_start
        if done > first and now > began:
            loading["rate"] = round((done - first) / (now - began))  # bytes/s, all ranks
            if done < total:
                loading["eta_s"] = round((total - done) / loading["rate"], 1)
        return loading

    def status(self) -> dict[str, Any]:
        loading = self._loading()
        now = self.clock()
        log_part: dict[str, Any] = {}
        if self.log is not None:
            log_part["error"] = self.log.error
            if self.phase in (EXITED, UNHEALTHY):
                log_part["log_tail"] = list(self.log.lines)
        elif self.config.log_capture_off:
            log_part["log_capture"] = f"off: {self.config.log_capture_off}"
        if not self.ever_ready and self.phase != EXITED:
            started = self.steps.entries[0]["at"] if self.steps.entries else None
            eta = startup_history.estimate(self.history, started, now, self.config.argv_digest)
            if eta:
                log_part["eta"] = eta
        current = self.steps.entries[-1] if self.steps.entries else {}
        moving = self._progress(loading, now)
        return {
            "phase": self.phase,
            "since": self.since,
            "heartbeat": self.clock(),
            "pid": self.config.pid,
            "watcher_pid": os.getpid(),
            "argv_digest": self.config.argv_digest,
            "url": self.config.base_url,
            "ready_file": self.config.ready_file,
            "ever_ready": self.ever_ready,
            "failures_in_row": self.failures_in_row,
            "last_error": self.last_error,
            "last_error_at": self.last_error_at,
            "reason": self.reason,
            "exit_code": self.exit_code,
            "hints": self.config.hints,
            "step": current.get("step"),
            "detail": current.get("detail"),
            "steps": self.steps.durations(now),
            **({"loading": loading} if loading else {}),
            **({"progress": moving} if moving else {}),
            "stale_after": self.config.stale_after,
            **({"model_runner": self.runner} if self.runner else {}),
            **({"speculative": self.speculative} if self.speculative else {}),
            **log_part,
            **({"node": self.config.node} if self.config.node else {}),
            **self.extra,
        }

    def write(self) -> None:
        # The readiness file never says more than the status: it goes after the status
        # says ready, and before the status says anything else. A reader that saw it
        # and then read the status once found "starting" (a CI run, 2 loaded cores).
        status = self.status()
        if self.phase == READY:
            write_json_atomic(self.config.status_file, status)
            ready = {k: status[k] for k in ("phase", "pid", "heartbeat", "argv_digest")}
            ready["pid_start"] = self.pid_start
            write_ready(self.config.ready_file, {**ready, "stale_after": self.config.stale_after})
        else:
            remove_quietly(self.config.ready_file)
            write_json_atomic(self.config.status_file, status)


def _opener() -> urllib.request.OpenerDirector:
    # No proxies: the server is local, and HTTP(S)_PROXY in the environment must not
    # route health checks elsewhere.
    return urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _get(base_url: str, path: str, timeout: float, api_key: str | None,
         body: dict[str, Any] | None = None) -> bytes:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    request = urllib.request.Request(base_url + path, data=data, headers=headers)
    with _opener().open(request, timeout=timeout) as response:
        return response.read()


def check_health(base_url: str, timeout: float, api_key: str | None) -> str | None:
    """None when /health and /v1/models both answer 200, else a short error."""
    for path in ("/health", "/v1/models"):
        try:
            body = _get(base_url, path, timeout, api_key)
            if path == "/v1/models" and not json.loads(body).get("data"):
                return "GET /v1/models: no model listed"
        except urllib.error.HTTPError as exc:
            return f"GET {path}: HTTP {exc.code}"
        except (urllib.error.URLError, OSError, ValueError) as exc:
            detail = getattr(exc, "reason", exc)
            return f"GET {path}: {detail}"
    return None


def scrape_metrics(base_url: str, timeout: float, api_key: str | None) -> dict[str, float] | None:
    """vLLM's /metrics as {name: value}, or None when it does not answer."""
    try:
        text = _get(base_url, "/metrics", timeout, api_key).decode("utf-8", "replace")
        return metrics.parse(text)
    except (urllib.error.URLError, OSError, ValueError):
        return None


class GenerationCheck:
    """One token from an idle server every `interval` seconds (off at 0).

    /metrics cannot tell an idle engine that would take no work from one that has
    none; a real request can. It runs in a thread so the heartbeat goes on meanwhile.
    A late token counts only once the engine has also moved nothing for `timeout`:
    work that arrived after the check started queues it behind real requests, and
    while that work progresses the engine is busy, not stuck (a stuck busy engine is
    the wedge watch's to name).
    """

    def __init__(self, config: WatchConfig, api_key: str | None) -> None:
        self.config, self.api_key = config, api_key
        self.last = time.time()
        self.thread: threading.Thread | None = None
        self.started = 0.0
        self.failure: str | None = None
        self.timed_out = False  # the last check's answer did not come within timeout

    def tick(self, idle: bool, now: float, quiet: float) -> str | None:
        """Start a check when one is due; why the server fails it, or None.

        `quiet`: seconds since the engine last moved anything (metrics.QuietClock)."""
        interval = self.config.generation_check_interval
        timeout = self.config.generation_check_timeout
        if interval <= 0:
            return None
        alive = self.thread is not None and self.thread.is_alive()
        late = self.timed_out or (alive and now - self.started > timeout)
        if late and quiet >= timeout:
            # It stands until a later check answers, as any other failure does.
            self.failure = f"generation check: no token within {timeout:g} s"
        busy = late and quiet < timeout
        # A check that was late only because the engine was busy is retried as soon
        # as the engine is idle, not left to count against it later.
        if not alive and idle and (busy or now - self.last >= interval):
            self.last = self.started = now
            self.timed_out = busy = False
            self.thread = threading.Thread(target=self._check, name="generation-check",
                                           daemon=True)
            self.thread.start()
        return None if busy else self.failure

    def _check(self) -> None:
        base, timeout = self.config.base_url, self.config.generation_check_timeout
        try:
            models = json.loads(_get(base, "/v1/models", timeout, self.api_key))
            model = models["data"][0]["id"]
            body = {"model": model, "prompt": "Hello", "max_tokens": 1, "temperature": 0}
            answer = json.loads(_get(base, "/v1/completions", timeout, self.api_key, body))
            if answer["usage"]["completion_tokens"] < 1:
                raise ValueError("the answer holds no token")
            self.failure = None
        except urllib.error.HTTPError as exc:
            self.failure = f"generation check: HTTP {exc.code}"
        except (urllib.error.URLError, OSError, ValueError, KeyError, IndexError,
                TypeError) as exc:
            detail = getattr(exc, "reason", exc)
            if isinstance(detail, TimeoutError):
                self.timed_out = True  # tick() judges it against the engine's progress
            else:
                self.failure = f"generation check: {detail}"


class NodeGroup:
    """Multi-node: a leader is healthy only while every remote rank stays connected
    (entrypoint/watch/node_links.py says why /health alone cannot tell) and every node it saw
    serving answers its heartbeat (entrypoint/watch/node_heartbeat.py: a frozen node closes
    nothing); a worker, whose health is the leader's API, only while its own ranks are
    connected too, and it answers the leader's heartbeat."""

    def __init__(self, node: dict[str, Any]) -> None:
        self.role = node.get("role")
        self.nnodes = int(node.get("nnodes") or 1)
        self.store_port = int(node.get("store_port") or 0)
        self.expected = int(node.get("remote_ranks") or 0)
        self.local = int(node.get("local_ranks") or 0)
        self.heartbeat_port = int(node.get("heartbeat_port") or 0)
        self.at_ready: Counter[str] | None = None
        self.last_whole: Counter[str] | None = None  # the latest complete count before that
        self.heartbeat = (
            node_heartbeat.Heartbeat(self.heartbeat_port)
            if self.role == "leader" and self.heartbeat_port
            else None
        )

    def start(self, stop: threading.Event) -> str | None:
        """The heartbeat's thread: the leader's pings, or a worker's answers. Returns
        why a worker cannot answer (its port taken since the start's check)."""
        if not self.heartbeat_port:
            return None
        if self.heartbeat is not None:
            threading.Thread(target=self.heartbeat.run_forever, args=(stop,),
                             name="heartbeat", daemon=True).start()  # fmt: skip
            return None
        if self.role == "worker":
            try:
                node_heartbeat.start_answering(self.heartbeat_port)
            except OSError as exc:
                return (
                    f"cannot answer the leader's heartbeat on {settings.HEARTBEAT_PORT}="
                    f"{self.heartbeat_port}: {exc.strerror or exc}"
                )
        return None

    def check(self, pids: list[int], ever_ready: bool) -> str | None:
        if self.role != "leader":
            joined = node_links.joined_ranks(self.store_port, pids)
            return node_links.worker_error(self.local, joined, self.store_port)
        now = node_links.remote_ranks(self.store_port, pids)
        if self.at_ready is None and sum(now.values()) >= self.expected:
            self.last_whole = now
        if ever_ready and self.at_ready is None and self.last_whole is not None:
            # Who was there when the group first served, taken from a complete count:
            # one taken in a round that missed a connection would leave a later loss
            # unnamed (seen once in CI: "lost a worker node" with no address). The round
            # that found the group whole ran before it was recorded as ready, so a node
            # lost before the next round is named from that round's count (seen once in
            # CI: the worker killed between the two, reported as "waiting for" it).
            self.at_ready = self.last_whole
            if self.heartbeat is not None:
                self.heartbeat.watch(self.at_ready)
        lost = node_links.lost_node_error(
            self.expected, now, self.at_ready, self.store_port, self.nnodes
        )
        if lost is None and self.heartbeat is not None:
            silent = self.heartbeat.silent()
            lost = node_heartbeat.silent_node_error(silent, self.heartbeat_port, self.nnodes)
        return lost


def root_cause_first(node_error: str | None, health_error: str | None) -> str | None:
    """One health-check error, a lost node first: once a group has served, a node's loss
    also breaks the leader's /health (its engine sees the peer go), and which of the two
    the watcher notices first is a race the reason must not depend on."""
    if node_error is None or health_error is None:
        return node_error or health_error
    return f"{node_error} (and the API fails: {health_error})"


def wait_for_exit(pid: int, poll: float = 0.1) -> None:
    """Block until `pid` has exited (zombie or gone)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    except (AttributeError, OSError):
        while pid_alive(pid):
            time.sleep(poll)
        return
    try:
        select.select([fd], [], [])
    finally:
        os.close(fd)


def run(config: WatchConfig, api_key: str | None = None) -> int:
    tracker = Tracker(config)
    lock = threading.Lock()
    done = threading.Event()
    tree: dict[int, str] = {}  # vLLM's descendants, refreshed every round
    group = NodeGroup(config.node or {})

    def on_exit() -> None:
        wait_for_exit(config.pid)
        with lock:
            tracker.exited(zombie_exit_status(config.pid))
            done.set()
            known = dict(tree)
        stopped = stop_leftovers(known)
        if stopped:
            with lock:
                tracker.extra["stopped_leftovers"] = stopped
                tracker.reason = f"{tracker.reason}; stopped what it left running: " + (
                    ", ".join(stopped)
                )
                tracker.write()

    def on_term(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    waiter = threading.Thread(target=on_exit, name="exit-waiter", daemon=True)
    waiter.start()
    wedge = metrics.WedgeWatch(config.wedge_seconds) if config.wedge_seconds > 0 else None
    generation = GenerationCheck(config, api_key)
    quiet_clock = metrics.QuietClock()
    beat_stop = threading.Event()
    cannot_answer = group.start(beat_stop)
    if cannot_answer:
        tracker.extra["heartbeat_error"] = cannot_answer
    try:
        with lock:
            tracker.write()
        while not done.is_set():
            below = descendants(config.pid, exclude=os.getpid())
            with lock:
                tree.update(below)
                tracker.read_log()
            error = check_health(config.base_url, config.timeout, api_key)
            if config.node and (error is None or tracker.ever_ready):
                lost = group.check([config.pid, *below], tracker.ever_ready)
                error = root_cause_first(lost, error)
            trouble = None
            if error is None:
                sample = scrape_metrics(config.base_url, config.timeout, api_key)
                if sample is not None:
                    now = time.time()
                    tracker.speculative = metrics.speculative(sample)
                    quiet = quiet_clock.update(sample, now)
                    trouble = wedge.update(sample, quiet) if wedge else None
                    idle = not sample.get(metrics.RUNNING) and not sample.get(metrics.WAITING)
                    trouble = trouble or generation.tick(idle, now, quiet)
            with lock:
                if done.is_set():
                    break
                tracker.record(error, trouble)
                why = tracker.stalled()
                if why:
                    tracker.give_up(why)
            if why:  # outside the lock: the exit waiter records vLLM's end meanwhile
                ended = stall.end_start(config.pid, dict(tree), config.stall_grace)
                with lock:
                    tracker.extra["stall_signals"] = ended
                    tracker.write()
            done.wait(config.interval)
    except SystemExit:
        with lock:
            if not done.is_set():
                tracker.stopped("watcher stopped by SIGTERM; readiness unknown")
        raise
    finally:
        beat_stop.set()
    waiter.join()  # it may still be stopping what vLLM left running
    return 0


def api_key_from(env: dict[str, str]) -> str | None:
    """The key vLLM was given (SERVE_API_KEY may list several as JSON), so /v1/models answers."""
    raw = (env.get("SERVE_API_KEY") or env.get("VLLM_API_KEY") or "").strip()
    if raw.startswith("["):
        try:
            keys = json.loads(raw)
        except ValueError:
            return raw
        return str(keys[0]) if isinstance(keys, list) and keys else None
    return raw or None


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m entrypoint.watch.watcher CONFIG_JSON", file=sys.stderr)
        return 2
    # Terminal signals are for vLLM; the watcher ends when vLLM ends.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    return run(WatchConfig.from_json(args[0]), api_key_from(dict(os.environ)))


if __name__ == "__main__":
    sys.exit(main())
