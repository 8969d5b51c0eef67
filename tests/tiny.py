"""Tiny random Llama models and small local lm-eval tasks, made on the spot for fast tests.

The model is random, so its answers are meaningless, but it is a real Llama checkpoint that both vLLM (CPU
attention needs head_dim >= 32) and transformers load, which is all the pipeline needs.
"""

from __future__ import annotations

import json
from pathlib import Path

WORDS = ("the a cat dog sat on mat ran far away big small red blue green house tree river stone "
         "one two three four five six seven eight nine ten is was and or but if then answer question "
         "what which who where when why how yes no true false").split()


def make_tiny_model(path: Path, *, seed: int = 0, layers: int = 2) -> Path:
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    path = Path(path)
    if (path / "config.json").exists():
        return path
    path.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    corpus = [" ".join(WORDS[i:] + WORDS[:i]) for i in range(len(WORDS))] + [str(i) for i in range(200)]
    tok.train_from_iterator(corpus, trainer)
    from tokenizers import decoders, processors

    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", 1)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>", pad_token="</s>")
    fast.save_pretrained(path)
    cfg = LlamaConfig(vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=128,
                      num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=2,
                      head_dim=32, max_position_embeddings=1024, bos_token_id=1, eos_token_id=2,
                      tie_word_embeddings=False, torch_dtype="float32")
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(8.0)  # sharper logits: greedy choices and generations that are not all ties
    model.save_pretrained(path, safe_serialization=True)
    return path


MC_YAML = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{label}}}}"
metric_list:
  - metric: acc
  - metric: acc_norm
"""

GEN_YAML = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "Q: {{{{question}}}}\\nA:"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: 12
  do_sample: false
metric_list:
  - metric: exact_match
"""


def make_tasks(root: Path, *, n_docs: int = 12, seed: int = 0) -> Path:
    """Write two local tasks, ``tiny_mc`` (multiple choice) and ``tiny_gen`` (generation), into ``root``."""
    import random

    rng = random.Random(seed)
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    mc, gen = [], []
    for _i in range(n_docs):
        q = " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 9)))
        choices = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 3))) for _ in range(4)]
        mc.append({"question": q, "choices": choices, "label": rng.randrange(4)})
        gen.append({"question": q, "answer": rng.choice(WORDS)})
    for name, rows, tmpl in (("tiny_mc", mc, MC_YAML), ("tiny_gen", gen, GEN_YAML)):
        data = root / f"{name}.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in rows))
        (root / f"{name}.yaml").write_text(tmpl.format(name=name, data=data))
    return root
