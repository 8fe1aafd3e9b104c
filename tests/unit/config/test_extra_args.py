"""EXTRA_ARGS as vLLM's parser reads it (config/extra_args.py), without vLLM: the committed option table.

tests/integration/test_extra_args_vllm.py proves the table equals the real parser's and that this resolver
lands every spelling on the option the real parser lands it on.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from hyperqwen.config.extra_args import (
    SECRET_FLAGS,
    check_extra_args,
    option_table,
    owned_dests,
    owned_flags,
    problems_in,
    resolve,
)
from hyperqwen.config.knobs import KNOBS
from hyperqwen.config.settings import SettingsError, resolve_settings
from hyperqwen.launch.command import build_command

KEY = "sk-test-0123456789abcdef"


def test_table_is_vllm_0_32_and_has_the_options_we_rely_on():
    table = option_table()
    assert table.version == "0.32.0"
    assert table.positionals == ("model_tag",)
    assert table.options["--api-key"].nargs == "+"
    assert table.options["--enforce-eager"].nargs == 0
    assert table.options["-tp"].dest == table.options["--tensor-parallel-size"].dest


def test_every_flag_a_knob_maps_to_exists_in_vllm():
    table = option_table()
    missing = sorted(flag for flag in owned_flags() if flag not in table.options)
    assert not missing, f"knobs.py maps knobs to flags vLLM {table.version} does not have: {missing}"


def test_owned_options_come_from_the_schema():
    dests = owned_dests()
    for dest, knob in [("api_key", "VLLM_API_KEY"), ("host", "BIND"), ("port", "PORT"), ("model", "MODEL"),
                       ("served_model_name", "SERVED_MODEL_NAME"), ("enable_prefix_caching", "PREFIX_CACHE"),
                       ("speculative_config", "SPEC"), ("max_model_len", "MAX_LEN"), ("hf_token", "HF_TOKEN")]:
        assert knob in dests[dest], (dest, dests.get(dest))
    # every knob whose maps_to starts with a vLLM flag owns it
    for knob in KNOBS:
        if knob.maps_to.startswith("--"):
            flag = knob.maps_to.split()[0]
            assert knob.name in dests[option_table().options[flag].dest], knob.name


@pytest.mark.parametrize("mode", ["single", "batch"])
@pytest.mark.parametrize("environ", [{}, {"SPEC": "mtp"}, {"TEMPERATURE": "0.7", "TOOLS": "1"}, {"KV_MEM": "5GiB"},
                                     {"GPU_UTIL": "0.9", "MAX_SEQS": "4", "MAX_BATCHED_TOKENS": "4096"},
                                     {"SPEC": "dflash2", "DRAFT": "d"}, {"VISION": "1", "TOOLS": "0"}])
def test_every_flag_the_builder_emits_is_refused_in_extra_args(mode, environ):
    """Whatever the argv builder sets, EXTRA_ARGS cannot set again: a knob's flag is refused when settings are
    resolved, one of the builder's own (BUILDER_FLAGS) when the command is built."""
    argv = build_command(resolve_settings(environ, mode=mode), api_key=KEY).vllm_args
    for flag in [w for w in argv if w.startswith("--")]:
        with pytest.raises(SettingsError, match="EXTRA_ARGS: word 1"):
            build_command(resolve_settings({**environ, "EXTRA_ARGS": f"{flag}=1"}, mode=mode), api_key=KEY)


@pytest.mark.parametrize("extra", [
    "--api-key K", "--api_key K", "--api_key=K", "--api-ke K", "--api-k=K", "--API-KEY K", "--api-key",
    "--port 1", "--po=1", "--host 0.0.0.0", "--hos=0.0.0.0", "--model x", "--mode=x", "--served-model-name x",
    "--served_model x", "--speculative-config {}", "--speculative_config.method mtp", "--speculative-config.method=mtp",
    "-sc {}", "--no-enable-prefix-caching", "--no-enable-prefix", "--enable_prefix_caching", "--max-num-seq 2",
    "--max_model_len=1", "--kv_cache_dtype fp8", "--language-model", "--hf-token t", "--hf_tok=t",
    "--config x.yaml", "--enforce-eager Mtp", "Mtp", "--enforce-eager -- --port 1", "--nonexistent-flag",
    "--m x", "--enforce-eager\n--port 1", "--enforce-eager\t--seed 1",
])
def test_refused_spellings(extra):
    with pytest.raises(SettingsError) as caught:
        resolve_settings({"EXTRA_ARGS": extra}, mode="single")
    errors = [p for p in caught.value.problems if p.severity == "error"]
    assert errors and all(p.knob == "EXTRA_ARGS" and p.message.startswith("EXTRA_ARGS: ") for p in errors)
    text = str(caught.value)
    assert "=K" not in text and "=t" not in text  # a value after '=' (maybe a key) is never echoed


@pytest.mark.parametrize(("extra", "knob"), [("--api_key=K", "VLLM_API_KEY"), ("--po 1", "PORT"),
                                             ("--served x", "SERVED_MODEL_NAME"), ("--max-num-seq 2", "MAX_SEQS"),
                                             ("-tp 2", "TP"), ("--speculative_config.method mtp", "SPEC")])
def test_refusal_names_the_knob_to_use(extra, knob):
    with pytest.raises(SettingsError, match=knob):
        resolve_settings({"EXTRA_ARGS": extra}, mode="single")


@pytest.mark.parametrize("extra", [
    "--enforce-eager", "--enforce_eager", "--max-log-len 100", "--max-log-len=100", "-tp2x=1" if False else "-q fp8",
    "--chat-template '/tmp/a b.jinja'", "--compilation-config.level 0", "--enable-log-requests",
    "--uvicorn-log-level warning", "--disable-uvicorn-access-log", "--allowed-origins '[\"https://a.example\"]'",
    "--limit-mm-per-prompt '{\"image\": 0}'", "-O0", "-O 3", "--seed -1", "--cudagraph-capture-sizes 1 2 4",
])
def test_accepted_extra_args(extra):
    settings = resolve_settings({"EXTRA_ARGS": extra}, mode="single")
    assert build_command(settings, api_key=KEY).vllm_args[-len(settings["EXTRA_ARGS"]):] == settings["EXTRA_ARGS"]


def test_resolution_follows_argparse_rules():
    words = resolve(["--enforce-eager", "--api_key", "a", "b", "--seed", "-1", "stray", "--x.y", "v"])
    kinds = [(w.text, w.kind, w.dest) for w in words]
    assert kinds[:7] == [("--enforce-eager", "option", "enforce_eager"), ("--api_key", "option", "api_key"),
                         ("a", "value", "api_key"), ("b", "value", "api_key"), ("--seed", "option", "seed"),
                         ("-1", "value", "seed"), ("stray", "positional", None)]
    assert kinds[7][1] == "unknown"


def test_control_characters_in_the_raw_text():
    assert check_extra_args(("--enforce-eager", "--seed", "1"), "--enforce-eager\r--seed 1") != []
    assert check_extra_args(("--enforce-eager", "--seed", "1"), "--enforce-eager\x1b--seed 1") != []
    # surrounding whitespace (a CRLF .env line) is not part of the value
    assert check_extra_args(("--enforce-eager",), "  --enforce-eager\r\n") == []


# --- fuzzing: any EXTRA_ARGS gives a valid command or clean errors naming EXTRA_ARGS -----------------------

OPTION_STRINGS = sorted(option_table().options)


def _spell(option: str, how: int, cut: int) -> str:
    if how == 0 or not option.startswith("--"):
        return option
    if how == 1:
        return "--" + option[2:].replace("-", "_")
    if how == 2:  # an abbreviation
        return option[: max(3, len(option) - cut)]
    return option.upper()


words = st.one_of(
    st.builds(_spell, st.sampled_from(OPTION_STRINGS), st.integers(0, 3), st.integers(0, 12)),
    st.builds(lambda o, v: f"{o}={v}", st.sampled_from(OPTION_STRINGS), st.text(max_size=8)),
    st.builds(lambda o, k: f"{o}.{k}", st.sampled_from(OPTION_STRINGS), st.text(max_size=6)),
    st.text(max_size=12),
    st.sampled_from(["--", "-", "-1", "0", "{}", "--api-key", "--port", KEY]),
)


@hsettings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(args=st.lists(words, max_size=6), mode=st.sampled_from(["single", "batch"]))
def test_any_extra_args_is_valid_or_a_clean_error(args, mode):
    import shlex

    raw = shlex.join(args)
    try:
        settings = resolve_settings({"EXTRA_ARGS": raw}, mode=mode)
        command = build_command(settings, api_key=KEY)  # refuses the builder's own flags (BUILDER_FLAGS)
    except SettingsError as exc:
        errors = [p for p in exc.problems if p.severity == "error"]
        assert errors and all(p.knob == "EXTRA_ARGS" for p in errors), exc.problems
        assert KEY not in str(exc) or KEY in [a.split("=", 1)[0] for a in args]
        return
    extra = command.vllm_args[len(command.vllm_args) - len(settings["EXTRA_ARGS"]):]
    owned = owned_dests()
    for word in resolve(extra):
        assert word.kind in ("option", "value"), word
        assert word.dest not in owned, word
    assert not problems_in(extra)


def test_secret_flags_are_vllm_flags():
    assert set(SECRET_FLAGS) <= set(option_table().options)


@pytest.mark.parametrize(("extra", "says"), [
    ("-h", "prints vLLM's help"), ("--help", "prints vLLM's help"), ("--hel", "prints vLLM's help"),
    ("--uds /tmp/s", "Unix socket"), ("--uds=/tmp/s", "Unix socket"), ("--headless", "without the API server"),
    ("--grpc", "gRPC"), ("--grpc-port 9000", "gRPC"), ("--enforce-eager=1", "takes none"),
    ("--enable-log-requests=true", "takes none"),
])
def test_extra_args_that_stop_serving_on_bind_port_are_refused(extra, says):
    with pytest.raises(SettingsError) as caught:
        resolve_settings({"EXTRA_ARGS": extra}, mode="single")
    (problem,) = [p for p in caught.value.problems if p.severity == "error"]
    assert problem.knob == "EXTRA_ARGS" and says in problem.message and "\n" not in problem.message


@pytest.mark.parametrize("extra", ["-h", "--enforce-eager=1", "--uds /tmp/s", "--enforce-eager"])
def test_print_and_start_agree_on_extra_args(extra, tmp_path, capsys, monkeypatch):
    """What `serve --print` accepts the real start accepts, and what one refuses the other refuses (exec is
    replaced by a recorder; the model directory exists so the start gets as far as the exec)."""
    from hyperqwen.cli import build_parser
    from hyperqwen.launch import serve

    monkeypatch.chdir(tmp_path)
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    environ = {"MODELS_DIR": str(tmp_path), "MODEL": "m", "EXTRA_ARGS": extra, "MEMORY_CHECK": "off",
               "HYPERQWEN_ENVIRONMENT_FILE": str(tmp_path / "environment.json")}
    executed: list[list[str]] = []

    def parse(words):
        return build_parser("serve").parse_args(["serve", *words])

    printed = serve.run(parse(["--print"]), environ)
    started = serve.run(parse([]), environ, execve=lambda path, argv, env: executed.append(argv))
    assert printed == started
    assert bool(executed) == (started == 0) == (extra == "--enforce-eager")
    assert "Traceback" not in capsys.readouterr().err
