"""The cache of files' hashes (``files.HashCache``) saves reading a model on every run, and never lets a
changed file pass as the one that was hashed.

The embedded model's folder is published with its hashes cached (``embedded._publish``), so that the run's
check of it (``embedded._verified``) and the model's fingerprint read none of its bytes again; any change to
a file's bytes after that, generated here as random edits (rewritten in place with the same size, the mtime
set back, appended, truncated, replaced by a rename, removed, a file added), is caught by both.
"""

from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path

import pytest

from evalparity import config, files, rundir
from evalparity.data import embedded


@pytest.fixture
def published(tmp_path, monkeypatch) -> Path:
    """A model-like folder published as the embedded model's is, in an empty cache."""
    monkeypatch.setenv(config.CACHE_ENV, str(tmp_path / "cache"))
    work = tmp_path / "models" / "tmpwork"
    work.mkdir(parents=True)
    rng = random.Random(5)
    (work / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    (work / "tokenizer.json").write_text("{}")
    (work / "model.safetensors").write_bytes(rng.randbytes(1 << 20))
    final = tmp_path / "models" / "m"  # published at once, as a conversion publishes what it just wrote
    embedded._publish(work, final)
    return final


def counting(monkeypatch) -> list[Path]:
    """The files whose bytes are read from now on, by any reader (``files._digest`` is the one place that
    reads a file to hash it)."""
    read: list[Path] = []
    real = files._digest

    def digest(f, stop=None):
        read.append(Path(f.name))
        return real(f, stop)

    monkeypatch.setattr(files, "_digest", digest)
    return read


def test_a_published_folder_is_checked_and_fingerprinted_without_reading_it_again(published, monkeypatch):
    read = counting(monkeypatch)
    assert embedded._verified(published)
    stats = rundir.HashStats()
    fp = rundir.model_fingerprint(published, "m", stats=stats)
    assert read == [] and stats.hashed_bytes == 0 and stats.cached_bytes == sum(
        p.stat().st_size for p in published.iterdir() if p.name != "MANIFEST.json")
    assert fp["files"]["model.safetensors"]["sha256"] == files.sha256(published / "model.safetensors")


KINDS = ("same size", "same size, mtime set back", "appended", "truncated", "renamed over", "removed", "added")


def _edit(rng: random.Random, folder: Path, kind: str) -> str:
    """A change of ``kind`` to a random file's bytes (a random byte of it, for the same-size ones); what it
    was, for the failure message."""
    target = folder / rng.choice(["config.json", "tokenizer.json", "model.safetensors"])
    data = target.read_bytes()
    st = target.stat()
    if kind.startswith("same size"):
        i = rng.randrange(len(data))
        target.write_bytes(data[:i] + bytes([data[i] ^ (1 + rng.randrange(255))]) + data[i + 1:])
        if kind.endswith("set back"):
            os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
    elif kind == "appended":
        with open(target, "ab") as f:
            f.write(b" ")
    elif kind == "truncated":
        target.write_bytes(data[:-1])
    elif kind == "renamed over":
        other = folder / ".new"
        other.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
        os.utime(other, ns=(st.st_atime_ns, st.st_mtime_ns))
        os.replace(other, target)
    elif kind == "removed":
        target.unlink()
    else:
        (folder / "extra.json").write_text("{}")
    return f"{kind}: {target.name}"


@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("kind", KINDS)
def test_any_change_after_publishing_is_caught_by_the_check_and_the_fingerprint(published, kind, seed):
    before = rundir.model_fingerprint(published, "m")
    assert embedded._verified(published)
    what = _edit(random.Random(seed), published, kind)
    assert not embedded._verified(published), what
    if what.startswith("added"):  # not a model file: the fingerprint leaves it out, the manifest does not
        return
    assert rundir.model_fingerprint(published, "m") != before, what


def test_the_same_bytes_written_again_are_hashed_again_and_still_pass(published, monkeypatch):
    target = published / "model.safetensors"
    target.write_bytes(target.read_bytes())  # a new ctime: the cached hash is not trusted for it
    read = counting(monkeypatch)
    assert embedded._verified(published) and read == [target]


def test_a_file_changed_while_it_is_hashed_for_the_manifest_is_not_cached(tmp_path, monkeypatch):
    """The stamp is read before the bytes: a write right after they were read (here, with the racy rule off)
    leaves a stamp that no longer matches, so the check hashes the file again and refuses the folder."""
    monkeypatch.setenv(config.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(files, "RACY_NS", 0)
    monkeypatch.setattr(embedded, "RACY_NS", 0)
    work = tmp_path / "models" / "tmpwork"
    work.mkdir(parents=True)
    (work / "model.safetensors").write_bytes(b"a" * 4096)
    real = files._digest

    def digest_then_write(f, stop=None):
        out = real(f, stop)
        if Path(f.name).name == "model.safetensors":
            Path(f.name).write_bytes(b"b" * 4096)
        return out

    monkeypatch.setattr(files, "_digest", digest_then_write)
    final = tmp_path / "models" / "m"
    embedded._publish(work, final)
    monkeypatch.setattr(files, "_digest", real)
    assert not embedded._verified(final)


def test_stamps_that_may_not_change_with_the_bytes_are_not_cached(tmp_path, monkeypatch):
    """A ctime just before the stamp (even with the mtime set back), and whole-second times (file systems
    that keep seconds only), are never cached; a cache file others may write is not believed."""
    monkeypatch.setenv(config.CACHE_ENV, str(tmp_path / "cache"))
    f = tmp_path / "w.bin"
    f.write_bytes(b"x" * 100)
    os.utime(f, ns=(0, time.time_ns() - 10 * files.RACY_NS))  # mtime old, ctime now
    cache = files.HashCache()
    assert cache.sha256(f)[0] == files.sha256(f) and not cache.changed
    time.sleep(files.RACY_NS / 1e9 + 0.05)
    assert cache.sha256(f)[0] == files.sha256(f) and cache.changed and cache.get(f, files.stamp(f))
    now = time.time_ns()
    whole = [100, 10**18, 10**18 + 10**9, 5, 2049, now]
    cache.put(tmp_path / "coarse", whole, "0" * 64)
    assert cache.get(tmp_path / "coarse", whole) is None
    cache.put(tmp_path / "fine", [100, 10**18 + 1, 10**18 + 10**9, 5, 2049, now], "0" * 64)
    assert cache.get(tmp_path / "fine", [100, 10**18 + 1, 10**18 + 10**9, 5, 2049, now]) == "0" * 64
    cache.save()
    assert files.HashCache().data == cache.data
    config.fingerprint_cache().chmod(0o664)  # group-writable: another user could vouch for bytes
    assert files.HashCache().data == {}


def test_entries_of_files_that_are_gone_are_dropped_when_the_cache_is_written(tmp_path, monkeypatch):
    monkeypatch.setenv(config.CACHE_ENV, str(tmp_path / "cache"))
    old, kept = tmp_path / "old.bin", tmp_path / "kept.bin"
    for f in (old, kept):
        f.write_bytes(b"x" * 10)
    time.sleep(files.RACY_NS / 1e9 + 0.05)
    cache = files.HashCache()
    cache.sha256(old)
    cache.sha256(kept)
    cache.save()
    assert len(files.HashCache().data) == 2
    old.unlink()
    new = tmp_path / "new.bin"
    new.write_bytes(b"y")
    time.sleep(files.RACY_NS / 1e9 + 0.05)
    cache = files.HashCache()
    cache.sha256(new)
    cache.save()
    assert sorted(Path(k).name for k in files.HashCache().data) == ["kept.bin", "new.bin"]


@pytest.mark.parametrize("seed", range(6))
def test_files_hashed_side_by_side_give_each_name_its_own_hash_reading_each_file_once(tmp_path, monkeypatch, seed):
    """``HashCache.sha256_all`` (the fingerprint's misses): generated folders of files, some reached under a
    second name (a symbolic or a hard link), some already cached. Each name gets ``sha256``'s answer, in the
    given order; each distinct file (device and inode) is read at most once, under its first name, unless that
    name's hash is cached; two or more files are read in threads of their own."""
    monkeypatch.setenv(config.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(files, "RACY_NS", 0)  # freshly written files may be cached at once here
    rng = random.Random(seed)
    folder = tmp_path / "m"
    folder.mkdir()
    names = []
    for i in range(rng.randint(1, 7)):
        p = folder / f"f{i}.safetensors"
        p.write_bytes(rng.randbytes(rng.randint(0, 1 << 16)))
        names.append(p)
        if i == 0 or rng.random() < 0.4:
            link = folder / f"l{i}.safetensors"
            if rng.random() < 0.5:
                link.symlink_to(p.name)
            else:
                os.link(p, link)
            names.append(link)
    rng.shuffle(names)
    cached = rng.sample(names, rng.randint(0, len(names) // 2))
    ahead = files.HashCache()
    ahead.sha256_all(cached)  # hashed and cached (whole-second times aside): these are not read below
    ahead.save()
    expected = {p: files.sha256(p) for p in names}

    reads: list[tuple[tuple[int, int], str]] = []  # (the file read: device and inode, the thread that read it)
    real = files._digest

    def inode(path) -> tuple[int, int]:
        st = os.stat(path)
        return st.st_dev, st.st_ino

    def digest(f, stop=None):
        reads.append((inode(f.name), threading.current_thread().name))
        time.sleep(0.05)  # long enough for the pool to hand the next file to another thread
        return real(f, stop)

    monkeypatch.setattr(files, "_digest", digest)
    got = files.HashCache().sha256_all(names)
    assert [g[0] for g in got] == [expected[p] for p in names]
    assert all(g[1][0] == p.stat().st_size for g, p in zip(got, names))
    read = [r for r, _ in reads]
    assert len(read) == len(set(read)), "a file was read twice"
    firsts: dict[tuple[int, int], Path] = {}
    for p in names:
        firsts.setdefault(inode(p), p)  # the name each file is hashed under: its first in the given order
    known = {os.path.realpath(p) for p in cached}
    assert set(read) == {i for i, p in firsts.items() if os.path.realpath(p) not in known}
    if len(read) >= 2 and (os.cpu_count() or 1) >= 2:
        assert len({t for _, t in reads}) >= 2, reads


def test_a_file_on_another_device_is_not_taken_for_the_cached_one(tmp_path, monkeypatch):
    """Two file systems mounted in turn at one path (a reused loop device or image) can repeat a file's size,
    times and inode; its device (``st_dev``) is part of the stamp, so the cached hash is not taken for it."""
    monkeypatch.setenv(config.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(files, "RACY_NS", 0)
    p = tmp_path / "model.safetensors"
    p.write_bytes(b"weights")
    cache = files.HashCache()
    digest, st, _ = cache.sha256(p)
    cache.save()
    assert files.HashCache().get(p, files.stamp(p)) == digest  # the same file: from the cache
    real = os.stat

    def on_another_device(path, *args, **kwargs):
        st = real(path, *args, **kwargs)
        if Path(path) == p:
            return os.stat_result((*st[:2], st.st_dev + 1, *st[3:7], st.st_atime, st.st_mtime, st.st_ctime),
                                  {"st_mtime_ns": st.st_mtime_ns, "st_ctime_ns": st.st_ctime_ns})
        return st

    monkeypatch.setattr(files.os, "stat", on_another_device)
    assert files.HashCache().get(p, files.stamp(p)) is None


def test_an_interrupt_stops_the_hashing_threads_at_their_next_chunk(tmp_path, monkeypatch):
    """Ctrl-C or SIGTERM (``cli.Stopped``, a KeyboardInterrupt) while a model's files are hashed side by side
    reaches the caller at once, and the threads have stopped at their next chunk instead of finishing their files
    (the review measured 17.4 s from SIGTERM to exit on two 3 GiB files, against 0.8 s one after another)."""
    import signal

    monkeypatch.setenv(config.CACHE_ENV, str(tmp_path / "cache"))
    for i in range(3):
        (tmp_path / f"f{i}").write_bytes(b"x")

    class Endless:  # a file that ends only after 30 s: the stop event should end its hash long before
        name = "endless"
        until = time.monotonic() + 30

        def read(self, n):
            time.sleep(0.01)
            return b"y" * 16 if time.monotonic() < self.until else b""

    def endless_hash(path, stop=None):
        return [0] * 6, files._digest(Endless(), stop)

    monkeypatch.setattr(files, "stamped_sha256", endless_hash)
    # a real signal wakes the caller waiting on the threads' results; Python's own Ctrl-C handler, whatever
    # this process inherited (a CI script started in the background, `cmd &`, runs with SIGINT ignored)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    main = threading.main_thread().ident
    threading.Timer(0.3, signal.pthread_kill, (main, signal.SIGINT)).start()
    t0 = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            files.HashCache().sha256_all(sorted(tmp_path.glob("f*")))
    finally:
        signal.signal(signal.SIGINT, previous)
    assert time.monotonic() - t0 < 3
    # every thread has stopped by the time the interrupt reaches the caller: none puts into the cache while
    # the caller saves it (the fingerprint saves in a finally)
    assert not [t.name for t in threading.enumerate() if t.name.startswith("sha256")]


def test_an_unreadable_model_file_is_one_line_naming_it_and_the_rest_stays_cached(tmp_path, monkeypatch):
    """A model file whose read fails (here an I/O error: a link to /proc/self/mem, readable even as root) was a
    traceback (exit 1); now a one-line error naming the file, and the hashes finished before it are cached."""
    from evalparity.errors import EvalParityError

    monkeypatch.setenv(config.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(files, "RACY_NS", 0)
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "model-00001-of-00002.safetensors").write_bytes(b"w" * 1000)
    (folder / "model-00002-of-00002.safetensors").symlink_to("/proc/self/mem")
    with pytest.raises(EvalParityError) as err:
        rundir.model_fingerprint(folder, str(folder))
    assert "\n" not in str(err.value) and "model-00002-of-00002.safetensors" in str(err.value)
    good = folder / "model-00001-of-00002.safetensors"
    assert files.HashCache().get(good, files.stamp(good)) == files.sha256(good)


@pytest.mark.parametrize("inode", [0, 42])
def test_files_whose_file_system_repeats_an_inode_are_not_taken_for_one(tmp_path, monkeypatch, inode):
    """Some FUSE and network file systems repeat or zero inode numbers: two different files with one inode
    each get their own hash (was: the second got the first's, a fingerprint naming the wrong bytes)."""
    monkeypatch.setenv(config.CACHE_ENV, str(tmp_path / "cache"))
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    a.write_bytes(b"first file")
    b.write_bytes(b"second file, longer")
    real = os.stat

    def one_inode(path, *args, **kwargs):
        st = real(path, *args, **kwargs)
        if Path(path).parent != tmp_path:
            return st
        fields = list(st[:10])
        fields[1] = inode  # st_ino
        return os.stat_result(fields, {"st_mtime_ns": st.st_mtime_ns, "st_ctime_ns": st.st_ctime_ns})

    monkeypatch.setattr(files.os, "stat", one_inode)
    got = files.HashCache().sha256_all([a, b])
    assert [g[0] for g in got] == [files.sha256(a), files.sha256(b)]
