"""The run folder: the one door to it. Every path in a run folder, every read and write of its records,
and the checks that make a sign-off come only from verified inputs live in this package; no module outside
it spells a run-folder path (``tests/test_architecture.py`` holds that).

- ``names``: the grammar of every name that becomes a path (cell names, ``compare --name``, shard units).
- ``layout``: where everything is (``spec_file``, ``cell_dir``, ``table``, ``stats_dir`` ...).
- ``records``: the typed records (``spec.json`` through ``spec.RunSpec``, ``cell.json`` as ``CellRecord``
  with its table's seal, ``compare.json``), each with one writer and one reader, and ``verify_run``, which
  the statistics come through.
- ``lock``: one process at a time in a run folder; outputs published whole (``staged_outputs``) and what a
  killed command left finished or removed (``recover_outputs``); no run inside another.
- ``fingerprint``: the model's files' hashes, part of the run's identity.

It imports nothing of evalparity but the leaves and ``spec``, so that ``cells``, ``matrix``, ``importer``,
``stats``, ``report``, ``drift`` and ``cli`` can all use it without an import cycle.
"""

from __future__ import annotations

from evalparity.rundir import (
    layout,
    records,  # noqa: E402,I001 - after names and layout, which it imports
)
from evalparity.rundir.fingerprint import HashStats, fingerprint_change, model_fingerprint
from evalparity.rundir.layout import attempts_dir
from evalparity.rundir.lock import (
    STALE_BREAK_S,
    RunLock,
    acquire,
    check_not_inside_a_run,
    check_out_path,
    contents,
    describe_holder,
    recover_outputs,
    staged_outputs,
    writable_dir_error,
)
from evalparity.rundir.names import NAME_RULE, check_name, check_name_ok, check_names, child

__all__ = ["layout", "records", "HashStats", "fingerprint_change", "model_fingerprint", "attempts_dir",
           "STALE_BREAK_S", "RunLock", "acquire", "check_not_inside_a_run", "check_out_path", "contents",
           "describe_holder", "recover_outputs", "staged_outputs", "writable_dir_error", "NAME_RULE",
           "check_name", "check_name_ok", "check_names", "child"]
