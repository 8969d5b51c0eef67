"""A synthetic C-Eval mirror: the 52 subjects of the hub dataset ``ceval/ceval-exam`` in its own layout and
field names, with a few made-up questions each, so that lm-eval's own ``ceval-valid`` group runs offline.

C-Eval cannot be downloaded on these machines, and its licence (CC BY-NC-SA) keeps it out of this
repository anyway; the tests only need data of the right shape to drive lm-eval's own C-Eval prompts,
choices and metrics end to end. Every question is arithmetic made up here and says so in its text
(``[synthetic]``), every record carries ``"synthetic": true``, and the folder holds a SYNTHETIC.md: nothing
written by this module can be mistaken for C-Eval results.

It lives beside the tests rather than in the package because it is of no use to a user with real data:
a user mirrors the real ``ceval/ceval-exam`` (see the README, "Air-gapped clusters: dataset mirrors"). A
developer can still write one by hand to try the README's command offline::

    python tests/synthetic_ceval.py DIR   # then: evalparity run --tasks ceval --datasets-dir DIR ...

Layout written (that of ``../shared/data``): ``DIR/ceval/ceval-exam/<subject>/{val,dev}.jsonl`` with the
hub's fields ``id, question, A, B, C, D, answer, explanation``. lm-eval's ``ceval-valid_*`` tasks evaluate
``val`` and take few-shot examples from ``dev``; the hub's ``test`` split (answers withheld) is not written.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HUB_ID = "ceval/ceval-exam"

# lm-eval 0.4.13's 52 ceval-valid members, by dataset_name (lm_eval/tasks/ceval/_generate_configs.py).
SUBJECTS = (
    "computer_network", "operating_system", "computer_architecture", "college_programming", "college_physics",
    "college_chemistry", "advanced_mathematics", "probability_and_statistics", "discrete_mathematics",
    "electrical_engineer", "metrology_engineer", "high_school_mathematics", "high_school_physics",
    "high_school_chemistry", "high_school_biology", "middle_school_mathematics", "middle_school_biology",
    "middle_school_physics", "middle_school_chemistry", "veterinary_medicine", "college_economics",
    "business_administration", "marxism", "mao_zedong_thought", "education_science", "teacher_qualification",
    "high_school_politics", "high_school_geography", "middle_school_politics", "middle_school_geography",
    "modern_chinese_history", "ideological_and_moral_cultivation", "logic", "law",
    "chinese_language_and_literature", "art_studies", "professional_tour_guide", "legal_professional",
    "high_school_chinese", "high_school_history", "middle_school_history", "civil_servant", "sports_science",
    "plant_protection", "basic_medicine", "clinical_medicine", "urban_and_rural_planner", "accountant",
    "fire_engineer", "environmental_impact_assessment_engineer", "tax_accountant", "physician",
)
LETTERS = ("A", "B", "C", "D")
NOTE = """# Synthetic C-Eval mirror (NOT C-Eval data)

Written by evalparity's tests/synthetic_ceval.py: {n} subjects of `ceval/ceval-exam` in the hub layout, with
made-up arithmetic questions (`[synthetic]` in every question, `"synthetic": true` in every record). Scores
on it mean nothing about a model; it exists so that lm-eval's ceval-valid tasks can run offline in tests.
"""


def question(subject_no: int, i: int, split: str) -> dict:
    """One made-up four-way question; the right answer's letter rotates so that no letter always wins."""
    a, b = 2 + (subject_no + i) % 7, 3 + (subject_no * 3 + i) % 5
    right = a + b
    slot = (subject_no + i + (split == "dev")) % 4
    options = [right + d for d in (-2, -1, 1, 2)]
    options.insert(slot, right)
    options = options[:4]
    rec = {"id": i, "question": f"[synthetic] {a} + {b} = ?"}
    rec.update({letter: str(v) for letter, v in zip(LETTERS, options)})
    rec.update(answer=LETTERS[slot], explanation="synthetic question, not from C-Eval", synthetic=True)
    return rec


def write_mirror(root: Path, *, val: int = 4, dev: int = 2, subjects: tuple[str, ...] = SUBJECTS) -> Path:
    """Write the mirror under ``root`` (a ``--datasets-dir``) and return ``root``. Idempotent."""
    base = Path(root) / HUB_ID
    for no, subject in enumerate(subjects):
        folder = base / subject
        folder.mkdir(parents=True, exist_ok=True)
        for split, n in (("val", val), ("dev", dev)):
            lines = [json.dumps(question(no, i, split), ensure_ascii=False) for i in range(n)]
            (folder / f"{split}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (base / "SYNTHETIC.md").write_text(NOTE.format(n=len(subjects)), encoding="utf-8")
    return Path(root)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tests/synthetic_ceval.py DIR")
    print(write_mirror(Path(sys.argv[1])) / HUB_ID)
