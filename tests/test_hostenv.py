"""A cell records the environment variables that steer the engines (``hostenv.steering_variables``): a
variable set in one shell and not in another (``VLLM_USE_V2_MODEL_RUNNER=0`` picked vLLM's other model runner
on the GPU machines, session 26) shows in the record instead of passing for drift; credentials never."""

from __future__ import annotations

import json
import random
import string

import pytest

from evalparity.hostenv import (
    ENV_PREFIXES,
    MAX_NAME,
    MAX_VALUE,
    MAX_VARIABLES,
    SECRET_WORDS,
    WITHHELD,
    WITHHELD_VALUE,
    may_hold_credential,
    steering_variables,
)


def test_steering_variables_are_kept_others_are_not_and_credentials_are_withheld():
    env = {"VLLM_USE_V2_MODEL_RUNNER": "0", "TRITON_F32_DEFAULT": "ieee", "HOME": "/root", "PATH": "/bin",
           "VLLM_API_KEY": "sk-secret", "HF_TOKEN": "hf_x", "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
           "TOKENIZERS_PARALLELISM": "false", "VLLM_AUTH_TOKENS": "t1,t2", "VLLM_PORT": "29500",
           "VLLM_OBJECT_STORAGE_SHM_BUFFER_NAME": "buf_1234", "VLLM_MAX_BAD_WORDS_TOTAL_TOKENS": "128"}
    got = steering_variables(env)
    assert got == {"$CUBLAS_WORKSPACE_CONFIG": ":4096:8", "$TRITON_F32_DEFAULT": "ieee",
                   "$VLLM_API_KEY": WITHHELD, "$VLLM_AUTH_TOKENS": WITHHELD, "$TOKENIZERS_PARALLELISM": "false",
                   "$VLLM_USE_V2_MODEL_RUNNER": "0", "$VLLM_MAX_BAD_WORDS_TOTAL_TOKENS": "128"}
    assert "sk-secret" not in json.dumps(got)


# The review's cases: names a first rule let through, and credentials in the values of innocuous names.
LEAKS = {
    "VLLM_PASSWORD2": "hunter2", "VLLM_HF_TOKEN1": "hf_abcdefghijklmnopqrstuvwxyz", "VLLM_TOKEN2": "zq9abc",
    "VLLM_PASS": "zq9pw", "VLLM_DB_PASS": "zq9pw", "VLLM_PWD": "zq9pw", "VLLM_CREDS": "zq9c", "VLLM_PASSPHRASE": "zq9p",
    "VLLM_JWT": "zq9j", "VLLM_BEARER": "zq9b", "VLLM_COOKIE": "zq9c", "VLLM_SIGNATURE": "zq9s", "VLLM_PRIVATE": "zq9p",
    "VLLM_DSN": "postgres://u:p@h/db", "VLLM_SSL_KEYFILE": "/etc/k.pem", "VLLM_SSL_CERTFILE": "/etc/c.pem",
    "vllm_api-key": "zq9k", "VLLM_OTLP_HEADERS": "Authorization=Bearer eyJhbGciOi.eyJzdWIi.sig",
    "VLLM_NOTE": "Bearer abc", "TORCH_SOMETHING": "-----BEGIN PRIVATE KEY-----",
    "VLLM_X": "hf_abcdefghijklmnopqrstuvwxyz0123", "VLLM_Y": "sk-proj-abcdefghijklmnop",
    "VLLM_Z": "ghp_" + "a" * 36, "VLLM_W": "AKIAABCDEFGHIJKLMNOP", "VLLM_V": "q" * 40,
}


@pytest.mark.parametrize("name", sorted(LEAKS))
def test_credentials_in_names_or_values_are_never_written(name):
    got = steering_variables({"VLLM_USE_V2_MODEL_RUNNER": "1", name: LEAKS[name]})
    assert LEAKS[name] not in json.dumps(got)


def test_a_url_keeps_its_host_and_loses_its_password():
    got = steering_variables({"VLLM_S3_ENDPOINT": "https://user:wJalrSecret@s3.example.com/bucket",
                              "TORCH_HUB_URL": "https://x:y@h.example/hub"})
    assert got == {"$TORCH_HUB_URL": "https://***@h.example/hub", "$VLLM_S3_ENDPOINT": "https://***@s3.example.com/bucket"}


def test_plain_numbers_show_under_a_token_threshold_name_and_no_other_credential_like_name():
    assert may_hold_credential("VLLM_MULTI_STREAM_GEMM_TOKEN_THRESHOLD")
    got = steering_variables({"VLLM_MULTI_STREAM_GEMM_TOKEN_THRESHOLD": "1024", "VLLM_KEY_CACHE": "true",
                              "VLLM_KEY": "zq9abc"})
    assert got == {"$VLLM_KEY": WITHHELD, "$VLLM_KEY_CACHE": WITHHELD,
                   "$VLLM_MULTI_STREAM_GEMM_TOKEN_THRESHOLD": "1024"}
    numeric = {"VLLM_PASSWORD": "123456", "VLLM_DB_PASS": "2024", "VLLM_SECRET": "true", "VLLM_API_KEY": "123"}
    assert steering_variables(numeric) == {f"${n}": WITHHELD for n in numeric}  # a numeric password is one


def test_many_or_long_variables_are_bounded():
    env = {f"VLLM_V{i:04d}": "1" for i in range(MAX_VARIABLES + 25)} | {"VLLM_" + "N" * 500: "x" * 1000}
    got = steering_variables(env)
    assert len(got) == MAX_VARIABLES + 1 and got["$..."] == "26 more not recorded"
    assert all(len(k) <= MAX_NAME + 4 and len(v) <= MAX_VALUE + 3 for k, v in got.items())


def test_generated_environments_give_one_printable_bounded_line_per_variable_and_never_a_secret():
    rng = random.Random(26)
    alphabet = string.ascii_letters + string.digits + " .,:;/%é日\x00\x1b\u2028"
    secret = list(SECRET_WORDS) + [w.lower() + "s" for w in SECRET_WORDS] + ["API_KEY", "OAUTH", "TOKEN2"]
    plain = ["PARALLELISM", "TOKENIZERS", "KEYBOARD", "USE", "V2", "MODEL", "RUNNER", "A-B", "THRESHOLD", ""]
    for _ in range(300):
        env, secrets = {}, set()
        for _ in range(rng.randint(0, 12)):
            parts = [rng.choice(plain) for _ in range(rng.randint(0, 3))]
            hidden = rng.random() < 0.3
            if hidden:
                parts.insert(rng.randint(0, len(parts)), rng.choice(secret))
            name = rng.choice(list(ENV_PREFIXES) + ["", "HOME_", "X_"]) + "_".join(parts)
            value = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 3 * MAX_VALUE)))
            env[name] = value + "x"  # never a plain number or switch: a credential-like name always withholds it
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
                assert shown == WITHHELD_VALUE or \
                    shown.startswith(value.encode("unicode_escape").decode("ascii")[:MAX_VALUE]), name


def test_the_report_tells_a_variable_set_to_none_from_one_unset():
    """A variable's value is its text: "None" is a value, shown against a cell where it was unset; a setting
    recorded as "None" (torch's CPU build writes ``torch_cuda`` so) stays among the unset ones."""
    from evalparity.report.sections import side_by_side

    table = side_by_side({"a": {"$VLLM_X": "None", "torch_cuda": "None", "$VLLM_Y": "None"},
                          "b": {"torch_cuda": "None", "$VLLM_Y": "None"}}, "environment")
    assert table.differing.rows == [["$VLLM_X", "None", "–"]]
    assert table.shared.rows == [["$VLLM_Y", "None"]] and table.unset == ["torch_cuda"]
