"""A cell records the environment variables that steer the engines (``hostenv.steering_variables``): a
variable set in one shell and not in another (``VLLM_USE_V2_MODEL_RUNNER=0`` picked vLLM's other model runner
on the GPU machines, session 26) shows in the record instead of passing for drift; credentials never."""

from __future__ import annotations

import json
import random
import string

from evalparity.hostenv import ENV_PREFIXES, MAX_VALUE, SECRET_WORDS, WITHHELD, steering_variables


def test_steering_variables_are_kept_others_are_not_and_credentials_are_withheld():
    env = {"VLLM_USE_V2_MODEL_RUNNER": "0", "TRITON_F32_DEFAULT": "ieee", "HOME": "/root", "PATH": "/bin",
           "VLLM_API_KEY": "sk-secret", "HF_TOKEN": "hf_x", "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
           "TOKENIZERS_PARALLELISM": "false", "VLLM_AUTH_TOKENS": "t1,t2"}
    got = steering_variables(env)
    assert got == {"$CUBLAS_WORKSPACE_CONFIG": ":4096:8", "$TRITON_F32_DEFAULT": "ieee",
                   "$VLLM_API_KEY": WITHHELD, "$VLLM_AUTH_TOKENS": WITHHELD, "$TOKENIZERS_PARALLELISM": "false",
                   "$VLLM_USE_V2_MODEL_RUNNER": "0"}
    assert "sk-secret" not in json.dumps(got)


def test_generated_environments_give_one_printable_bounded_line_per_variable_and_never_a_secret():
    rng = random.Random(26)
    alphabet = string.printable + "é日\x00\x1b\u2028"
    secret = [w for w in SECRET_WORDS] + [w.lower() + "s" for w in SECRET_WORDS] + ["API_KEY", "OAUTH"]
    plain = ["PARALLELISM", "TOKENIZERS", "KEYBOARD", "USE", "V2", "MODEL", "RUNNER", "é", "A-B", ""]
    for _ in range(300):
        env, secrets = {}, set()
        for _ in range(rng.randint(0, 12)):
            parts = [rng.choice(plain) for _ in range(rng.randint(0, 3))]
            hidden = rng.random() < 0.3
            if hidden:
                parts.insert(rng.randint(0, len(parts)), rng.choice(secret))
            name = rng.choice(list(ENV_PREFIXES) + ["", "HOME_", "X_"]) + "_".join(parts)
            env[name] = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 3 * MAX_VALUE)))
            if hidden:
                secrets.add(name)
        got = steering_variables(env)
        escaped = {n: "$" + n.encode("unicode_escape").decode("ascii") for n in env}
        assert set(got) == {escaped[n] for n in env if n.startswith(ENV_PREFIXES)}
        for name, value in env.items():
            shown = got.get(escaped[name])
            if shown is None:
                continue
            assert shown.isascii() and shown.isprintable() and len(shown) <= MAX_VALUE + 3
            if name in secrets:
                assert shown == WITHHELD, name
            else:
                assert shown.startswith(value.encode("unicode_escape").decode("ascii")[:MAX_VALUE]), name
