"""Named cell variants (``--cell NAME=BACKEND:DTYPE[:key=value,...]``, evalparity/variants.py): parsing, the
one-line refusals, the variant as part of a cell's identity (recorded, verified, resumed), and a real tiny run
with a variant cell."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest
from conftest import VARIANT_CELLS, evalparity, hf_variant_args, one_line_error
from hypothesis import given, settings
from hypothesis import strategies as st
from synthetic import make_run, reseal

from evalparity import backends, variants
from evalparity.cellenv import cell_environment
from evalparity.errors import EvalParityError
from evalparity.matrix import prepare_run_dir
from evalparity.rundir import records
from evalparity.rundir.names import NAME_RE
from evalparity.spec import CellSpec, RunSpec

NO_ARGS: dict[str, str] = {}


def test_a_variant_holds_its_engine_args_env_and_own_keys():
    c = variants.parse_cell("vllm-fp8=vllm:bf16:quantization=fp8,env.VLLM_BATCH_INVARIANT=1,batch_size=4,"
                            "python=alt", 8, 1, {"vllm": "max_num_seqs=7,quantization=none"})
    assert c.name == "vllm-fp8" and c.backend == "vllm" and c.dtype == "bfloat16" and c.batch_size == 4
    assert dict(c.args) == {"max_num_seqs": "7", "quantization": "fp8"}  # the cell's keys over --vllm-args
    assert c.env == (("VLLM_BATCH_INVARIANT", "1"),) and c.python == "alt" and c.model == ""
    assert c.variant() == {"args": {"max_num_seqs": "7", "quantization": "fp8"},
                           "env": {"VLLM_BATCH_INVARIANT": "1"}, "python": "alt"}
    url = variants.parse_cell("prod=vllm:fp16:base_url=http://10.0.0.5:8000/v1", 8, 1, NO_ARGS)
    assert dict(url.args) == {"base_url": "http://10.0.0.5:8000/v1"}  # a value may hold ':'


@pytest.mark.parametrize("typed, says", [
    ("vllm-fp8", "write NAME=BACKEND:DTYPE"),
    ("x=vllm", "write NAME=BACKEND:DTYPE"),
    ("=vllm:bf16", "write NAME=BACKEND:DTYPE"),
    ("../x=vllm:bf16", "not a safe name"),
    ("x.r0=vllm:bf16", "ends like a staged run's part"),
    ("x.1of2=vllm:bf16", "ends like a staged run's part"),
    ("x=tgi:bf16", "unknown backend"),
    ("x=vllm:int4", "unknown dtype"),
    ("x=vllm:bf16:quantization", "is not key=value"),
    ("x=vllm:bf16:a=1,a=2", "a is given twice"),
    ("x=vllm:bf16:dtype=float16", "dtype cannot be set per cell"),
    ("x=hf:bf16:pretrained=/other", "give another checkpoint as model=PATH"),
    ("x=vllm:bf16:max_model_len=99", "--max-length"),
    ("x=vllm:bf16:tensor_parallel_size=0", "not a whole number of GPUs"),
    ("x=vllm:bf16:tensor_parallel_size=1.5", "not a whole number of GPUs"),
    ("x=hf:bf16:tensor_parallel_size=2", "not an argument of the hf backend"),
    ("x=vllm:bf16:env.1BAD=1", "not an environment variable's name"),
    ("x=vllm:bf16:python=", "python= is empty"),
    ("x=vllm:bf16:python=../bin", "not a safe name"),
    ("x=vllm:bf16:batch_size=0", "positive number or auto"),
])
def test_a_bad_cell_is_refused_in_one_line_naming_the_problem(typed, says):
    with pytest.raises(EvalParityError) as err:
        variants.parse_cell(typed, 8, 1, NO_ARGS)
    assert says in str(err.value) and "\n" not in str(err.value)


@settings(max_examples=200, deadline=None)
@given(name=st.text(min_size=0, max_size=30), rest=st.text(max_size=40))
def test_any_typed_cell_is_a_safe_cell_or_one_line(name, rest):
    """Whatever is typed: a cell whose name is one safe path component and whose backend and dtype are known,
    or a one-line EvalParityError: never another exception, never a name that leaves cells/."""
    try:
        c = variants.parse_cell(f"{name}={rest}", 8, 1, {"vllm": "", "hf": ""})
    except EvalParityError as err:
        assert "\n" not in str(err)
        return
    assert NAME_RE.fullmatch(c.name) and c.name == name.strip()
    assert c.backend in ("vllm", "hf") and c.dtype in ("float32", "bfloat16", "float16")
    assert all(k and k not in variants.REFUSED for k, _ in c.args)


def test_the_run_s_cells_refuse_a_name_given_twice_and_fill_the_backend_args():
    matrix = (CellSpec("hf", "float32", 8), CellSpec("vllm", "bfloat16", 8))
    cells = variants.run_cells(matrix, ["fp8=vllm:bf16:quantization=fp8"], 8, 1,
                               {"hf": "attn_implementation=eager", "vllm": ""})
    assert [c.name for c in cells] == ["hf-fp32", "vllm-bf16", "fp8"]
    assert dict(cells[0].args) == {"attn_implementation": "eager"} and cells[1].args == ()
    for typed in (["vllm-bf16=vllm:bf16:quantization=fp8"], ["a=vllm:bf16", "a=hf:fp32"]):
        with pytest.raises(EvalParityError, match="listed twice"):
            variants.run_cells(matrix, typed, 8, 1, NO_ARGS)
    with pytest.raises(EvalParityError, match="dtype cannot be set"):
        variants.run_cells(matrix, [], 8, 1, {"hf": "dtype=float16"})


def test_a_named_cell_is_repeated_with_its_variant_for_its_own_noise_floor():
    fp8 = "fp8=vllm:bf16:quantization=fp8"
    cells = variants.run_cells((CellSpec("hf", "float32", 8),), [fp8], 8, 1, NO_ARGS, ["fp8:1", "fp8:dp2", "hf-fp32:4"])
    by = {c.name: c for c in cells}
    assert list(by) == ["hf-fp32", "fp8", "fp8-bs1", "fp8-dp2", "hf-fp32-bs4"]
    assert by["fp8-bs1"].args == by["fp8"].args and by["fp8-bs1"].batch_size == 1 and by["fp8-bs1"].base_name == "fp8"
    assert by["fp8-dp2"].shards == 2 and by["fp8-dp2"].variant() == by["fp8"].variant()
    for typed, says in (("nope:1", "not a cell of this run"), ("fp8:8", "own batch size"), ("fp8:x", "NAME:batch_size"),
                        ("fp8:dp1", "another count")):
        with pytest.raises(EvalParityError, match=says):
            variants.run_cells((), [fp8], 8, 1, NO_ARGS, [typed])


def test_the_args_and_env_reach_the_engine_and_the_process():
    cell = variants.parse_cell("bi=vllm:bf16:max_num_seqs=7,env.VLLM_BATCH_INVARIANT=1", 8, 1, NO_ARGS)
    spec = RunSpec(model="m", tasks=("t",), cells=(cell,))
    assert backends.get("vllm").model_args(spec, cell, "/m")["max_num_seqs"] == 7
    env = cell_environment(backends.get("vllm").environment(spec, cell), offline=True, cell=cell)
    assert env["VLLM_BATCH_INVARIANT"] == "1" and env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    mine = variants.parse_cell("x=vllm:bf16:env.VLLM_ENABLE_V1_MULTIPROCESSING=1", 8, 1, NO_ARGS)
    env = cell_environment(backends.get("vllm").environment(spec, mine), offline=True, cell=mine)
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "1"  # the user's own setting wins, and is recorded


def test_variants_survive_spec_json_and_its_checks(tmp_path):
    cells = (CellSpec("hf", "float32", 8),
             variants.parse_cell("fp8=vllm:bf16:quantization=fp8,env.A=1", 8, 1, NO_ARGS))
    spec = RunSpec(model="m", tasks=("t",), cells=cells)
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec.to_json()))
    back = RunSpec.from_json(records.check_spec(path))
    assert back.cells == cells and back.identity() == spec.identity()
    data = spec.to_json()
    data["cells"][1]["name"] = "other"  # a name that is not the cell's label
    path.write_text(json.dumps(data))
    with pytest.raises(EvalParityError, match="named fp8"):
        records.check_spec(path)
    data = spec.to_json()
    data["cells"][1]["args"] = [["quantization", 8]]
    path.write_text(json.dumps(data))
    with pytest.raises(EvalParityError, match="pair of strings"):
        records.check_spec(path)


def _variant_run(root):
    """A synthetic run whose cell vllm-bf16 has become the variant ``fp8`` (spec and record alike)."""
    run = make_run(root, n_tasks=1, cells=["hf-fp32", "vllm-bf16"], docs_per_task=5)
    spec = json.loads((run / "spec.json").read_text())
    entry = next(c for c in spec["cells"] if c["name"] == "vllm-bf16")
    entry |= {"name": "fp8", "label": "fp8", "args": [["quantization", "fp8"]]}
    (run / "spec.json").write_text(json.dumps(spec))
    (run / "cells" / "vllm-bf16").rename(run / "cells" / "fp8")
    rec = json.loads((run / "cells" / "fp8" / "cell.json").read_text())
    rec |= {"cell": "fp8", "base_cell": "fp8", "variant": {"args": {"quantization": "fp8"}}}
    (run / "cells" / "fp8" / "cell.json").write_text(json.dumps(rec))
    reseal(run)  # the records as a run of these cells would have written them (run_cells: fp8, not vllm-bf16)
    return run


def test_a_record_whose_variant_is_not_the_spec_s_is_refused(tmp_path):
    run = _variant_run(tmp_path / "run")
    assert set(records.verify_run(run).cells) == {"hf-fp32", "fp8"}
    path = run / "cells" / "fp8" / "cell.json"
    rec = json.loads(path.read_text())
    for edited in ({"args": {"quantization": "none"}}, {}, {"args": {"quantization": "fp8"}, "env": {"A": "1"}}):
        path.write_text(json.dumps(rec | {"variant": edited}))
        with pytest.raises(EvalParityError, match="variant"):
            records.verify_run(run)


def test_a_resume_that_asks_other_settings_of_a_finished_cell_is_refused(tmp_path):
    run = _variant_run(tmp_path / "run")
    spec = records.read_spec(run)
    prepare_run_dir(run, spec)  # the same cells: resumes
    other = replace(spec, cells=tuple(replace(c, args=(("quantization", "awq"),)) if c.label else c
                                      for c in spec.cells))
    with pytest.raises(EvalParityError) as err:
        prepare_run_dir(run, other)
    assert "fp8 finished with other settings (quantization=fp8 (ref: awq)" in str(err.value)
    prepare_run_dir(run, other, force=True)  # --force reruns it with the new ones


def test_a_tiny_run_with_a_variant_cell(hf_variant_run, tiny_tasks):
    """With --cell and no matrix, the run is the reference (hf-fp32) and the named cell; the variant's
    argument reaches lm-eval's model, its record says what it is, and it signs off against the reference.
    (The shared run of conftest.hf_variant_run, which applies a chat template too.)"""
    model, out, proc = hf_variant_run
    assert proc.returncode in (0, 3, 4), proc.stderr[-3000:]  # 4: INCONCLUSIVE on 6 docs
    spec = json.loads((out / "spec.json").read_text())
    assert [c["name"] for c in spec["cells"]] == VARIANT_CELLS
    rec = json.loads((out / "cells" / "eager" / "cell.json").read_text())
    assert rec["status"] == "ok" and rec["variant"] == {"args": {"attn_implementation": "eager"}}
    assert rec["model_args"]["attn_implementation"] == "eager"
    ref = json.loads((out / "cells" / "hf-fp32" / "cell.json").read_text())
    assert ref["variant"] == {} and "attn_implementation" not in ref["model_args"]
    verdicts = json.loads((out / "stats" / "verdicts.json").read_text())
    assert {(c["kind"], c["reference"], c["cell"]) for c in verdicts["comparisons"]} == \
        {("cross", "hf-fp32", "eager"), ("noise_floor", "eager", "eager-bs2")}  # the variant's own noise floor
    again_rec = json.loads((out / "cells" / "eager-bs2" / "cell.json").read_text())
    assert again_rec["variant"] == rec["variant"] and again_rec["model_args"]["batch_size"] == 2
    # another setting for the finished cell, same folder: refused in one line before anything runs
    again = evalparity(*hf_variant_args(model, tiny_tasks, out, "eager=hf:fp32:attn_implementation=sdpa"))
    assert again.returncode == 2
    assert "eager finished with other settings" in one_line_error(again)


@pytest.mark.parametrize("typed, says", [
    ("t=hf:fp32:tokenizer=/tmp/tok", "whose tokenizer is checked"),
    ("t=hf:fp32:peft=/tmp/adapter", "adapters are not fingerprinted"),
    ("t=vllm:bf16:lora_local_path=/tmp/a", "adapters are not fingerprinted"),
    ("t=hf:fp32:revision=main", "revisions are not pinned"),
    ("t=hf:fp32:env.TOKENIZERS_PARALLELISM=true", "evalparity sets TOKENIZERS_PARALLELISM"),
    ("t=hf:fp32:env.HF_HUB_OFFLINE=0", "evalparity sets HF_HUB_OFFLINE"),
    ("t=hf:fp32:env.EVALPARITY_PLACEMENT={}", "evalparity sets EVALPARITY_PLACEMENT"),
    ("t=hf:fp32:env.CUDA_VISIBLE_DEVICES=1", "evalparity sets CUDA_VISIBLE_DEVICES"),
])
def test_inputs_that_would_be_recorded_but_not_be_what_ran_are_refused(typed, says):
    """Found by an adversarial review: a tokenizer or adapter by path would be read unfingerprinted (a resume
    after its files changed kept old results), and evalparity's own variables are set after the cell's."""
    with pytest.raises(EvalParityError, match=says):
        variants.parse_cell(typed, 8, 1, NO_ARGS)


def test_a_pair_and_its_reverse_are_one_comparison():
    from evalparity.stats.options import parse_compare

    assert parse_compare(["a:b"]) == (("a", "b"),)
    with pytest.raises(EvalParityError, match="the same two cells"):
        parse_compare(["a:b", "b:a"])


def test_a_misspelt_engine_argument_is_refused_before_any_cell_starts():
    """vLLM refuses unknown keywords only when the engine is built (the cell fails at its load, and a staged
    run's round with it): the names are checked against vLLM's EngineArgs, LLM's and lm-eval's vllm model's."""
    from evalparity.backends import server, vllm

    vllm.check_cell(variants.parse_cell("ok=vllm:bf16:quantization=fp8,kv_cache_dtype=fp8,enforce_eager=false,"
                                        "max_num_seqs=7,max_batch_size=4", 8, 1, NO_ARGS))
    with pytest.raises(EvalParityError, match=r"quantisation is not an argument .*did you mean quantization\?"):
        vllm.check_cell(variants.parse_cell("x=vllm:bf16:quantisation=fp8", 8, 1, NO_ARGS))
    # a python= cell's vLLM is another interpreter's: its names are not this one's to judge
    vllm.check_cell(variants.parse_cell("x=vllm:bf16:python=venv2,quantisation=fp8", 8, 1, NO_ARGS))
    with pytest.raises(EvalParityError, match=r"kv_cache_dtpe is not a flag of vllm serve .*kv_cache_dtype\?"):
        server.check_cell(variants.parse_cell("s=server:bf16:kv_cache_dtpe=fp8", 8, 1, NO_ARGS))


def test_a_started_servers_keys_are_vllm_serves_flags():
    """A server evalparity starts takes ``vllm serve``'s flags (read from its own ``--help=all``), not the
    in-process engine's arguments: lm-eval's vllm-model options are refused before any cell starts (they failed
    the server's start), the server's own flags pass (they were refused), and host/port are evalparity's."""
    from evalparity.backends import server

    def check(keys: str) -> None:
        server.check_cell(variants.parse_cell(f"s=server:bf16:{keys}", 8, 1, NO_ARGS))

    check("quantization=fp8,kv_cache_dtype=fp8,enforce_eager=false,enable_log_requests=true,max_num_seqs=7")
    for key, needle in (("max_gen_toks=64", "max_gen_toks is not a flag of vllm serve"),
                        ("max_batch_size=4", "max_batch_size is not a flag of vllm serve"),
                        ("quantisation=fp8", "did you mean quantization?"),
                        ("port=8000", "port= is evalparity's to choose"),
                        ("host=0.0.0.0", "host= is evalparity's to choose"),
                        ("api_key=sk-secret", "api_key= would be written into the run folder")):
        with pytest.raises(EvalParityError, match=re.escape(needle)):
            check(key)
    check("python=venv2,max_gen_toks=64")  # another interpreter's vLLM: not this one's to judge
    # the user's server takes no engine keys at all (server_cell), whatever their names
    with pytest.raises(EvalParityError, match="cannot be applied to the server at"):
        server.server_cell(variants.parse_cell("u=server:bf16:url=http://127.0.0.1:9/v1,quantization=fp8", 8, 1,
                                               NO_ARGS))


def test_vllm_serves_flag_names_are_parsed_once_and_kept(tmp_path, monkeypatch):
    """The help's option lines as Python names; the answer kept in the cache directory per vLLM version, so
    that a later process does not run ``vllm serve --help=all`` again (12-15 s on 2 cores)."""
    import subprocess

    from evalparity.backends import server

    text = ("options:\n  -h, --help            show this help\n  --kv-cache-dtype {auto,fp8}\n"
            "  -q QUANTIZATION, --quantization QUANTIZATION\n  --enforce-eager, --no-enforce-eager\n"
            "                        --port instead of the HTTP server (a description, not a flag)\n")
    assert server.parse_flag_names(text) == {"help", "kv_cache_dtype", "quantization", "enforce_eager"}
    assert server.parse_flag_names("  -q QUANTIZATION, --quantization Q\n") == {"quantization"}
    # an option with two long names (vLLM's --gpu-memory-utilization has an alias)
    assert server.parse_flag_names("  --gpu-memory-utilization X, --device-memory-utilization X\n"
                                   "                        Fraction, see --other-flag\n") == {
        "gpu_memory_utilization", "device_memory_utilization"}
    monkeypatch.setenv("EVALPARITY_CACHE", str(tmp_path))
    server.serve_flag_names.cache_clear()
    real_run, helps = subprocess.run, []

    def kept(*a, **k):  # the real help, kept for the re-read below (one real run of it in this test)
        helps.append(real_run(*a, **k))
        return helps[-1]

    try:
        monkeypatch.setattr(subprocess, "run", kept)
        first = server.serve_flag_names()
        assert first is not None and {"quantization", "kv_cache_dtype", "api_key", "port"} <= first
        assert "max_gen_toks" not in first and len(list(tmp_path.glob("vllm-serve-flags-*.json"))) == 1
        assert len(helps) == 1
        server.serve_flag_names.cache_clear()

        def no_run(*a, **k):
            raise AssertionError("vllm serve --help=all run again")

        monkeypatch.setattr(subprocess, "run", no_run)
        assert server.serve_flag_names() == first
        # a cache file edited down to a few names is not trusted: read again from the help (its same text)
        (cache_file,) = tmp_path.glob("vllm-serve-flags-*.json")
        cache_file.write_text(json.dumps({"flags": ["model"]}))
        server.serve_flag_names.cache_clear()
        again = []
        monkeypatch.setattr(subprocess, "run", lambda *a, **k: again.append(a) or helps[0])
        assert server.serve_flag_names() == first and len(again) == 1
        assert set(json.loads(cache_file.read_text())["flags"]) == first  # and written back whole
    finally:
        server.serve_flag_names.cache_clear()


def test_engine_argument_names_read_from_source_are_the_imported_ones(tmp_path, monkeypatch):
    """The names parsed from vLLM's and lm-eval's source (no import: 15-19 s of an H200's setup) equal those the
    import reads; a source of another shape (EngineArgs with a base class) is not parsed but imported."""
    import importlib.util

    from evalparity.backends import vllm

    parsed = vllm.engine_arg_names_from_source()
    imported = vllm.engine_arg_names_from_import()
    assert parsed is not None and len(parsed) > 100
    assert parsed == imported, sorted(parsed ^ imported)

    fake = tmp_path / "vllm"
    (fake / "engine").mkdir(parents=True)
    (fake / "entrypoints").mkdir()
    (fake / "__init__.py").write_text("")
    (fake / "engine" / "arg_utils.py").write_text(
        "from dataclasses import dataclass\n@dataclass\nclass EngineArgs(Base):\n    model: str = ''\n")
    (fake / "entrypoints" / "llm.py").write_text("class LLM:\n    def __init__(self, model, **kw): ...\n")
    real = importlib.util.find_spec

    def find_spec(name, *a, **k):
        return importlib.util.spec_from_file_location("vllm", fake / "__init__.py",
                                                      submodule_search_locations=[str(fake)]) \
            if name == "vllm" else real(name, *a, **k)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    assert vllm.engine_arg_names_from_source() is None  # fields may be inherited: import instead
    (fake / "engine" / "arg_utils.py").write_text(
        "from dataclasses import dataclass\n@dataclass\nclass EngineArgs:\n    model: str = ''\n"
        "    if FLAG:\n        extra: int = 0\n")
    assert vllm.engine_arg_names_from_source() is None  # a field under a condition: import instead


def test_a_resume_keeps_the_order_of_the_runs_cells(tmp_path):
    """spec.json keeps the union of the cells a run folder was given, in the order they first came: a resume
    that names some of them, or names them in another order, does not reorder the report's rows (session 32's
    review, F11); a cell added comes last."""
    from synthetic import synthetic_spec

    run = tmp_path / "run"
    prepare_run_dir(run, synthetic_spec(["hf-fp32", "vllm-fp32", "hf-bf16"]))
    prepare_run_dir(run, synthetic_spec(["hf-bf16", "hf-fp32"]))
    assert [c.name for c in records.read_spec(run).cells] == ["hf-fp32", "vllm-fp32", "hf-bf16"]
    prepare_run_dir(run, synthetic_spec(["vllm-bf16", "vllm-fp32"]))
    assert [c.name for c in records.read_spec(run).cells] == ["hf-fp32", "vllm-fp32", "hf-bf16", "vllm-bf16"]
