"""EXTRA_ARGS, read the way vLLM's own parser reads it, before anything starts.

vLLM 0.32.0's server parser (`make_arg_parser` on a `FlexibleArgumentParser`, vllm/utils/argparse_utils.py)
is lenient: it turns underscores into dashes in a `--flag` name (`--api_key` is `--api-key`), accepts any
unambiguous prefix of a long option (argparse's allow_abbrev: `--api-k` is `--api-key`), reads `--flag.key
value` as JSON for `--flag`, and takes a stray word as its positional `model_tag`, which the OpenAI server
ignores. A check on the literal spelling (`--api-key`) is therefore bypassed by `--api_key`, `--api-ke=K`,
and so on. This module resolves every word of EXTRA_ARGS to the vLLM option it lands on, with the same rules,
against vLLM's option table, and refuses:

- options HyperQwen sets itself from a knob (the key, host, port, model, served name, and every flag a knob
  maps to; derived from `knobs.py`'s `maps_to`), naming the knob to use instead;
- `--config FILE` (a YAML file can set any option, owned ones included);
- options vLLM 0.32.0 does not have, or prefixes that match several (vLLM would refuse them at start);
- stray words (vLLM would take the first as `model_tag` and ignore it) and control characters.

The option table is `vllm_options.json` next to this file, generated from the real parser
(`python -m hyperqwen.config.extra_args --write`, needs vLLM); an integration test proves that regenerating it
gives the same file and that this resolver agrees with the real parser. It is used where vLLM is not
importable (the unit tier, `hyperqwen serve --print` on a laptop) and everywhere else too: importing vLLM's
parser takes 10-30 s (torch), too slow for settings resolution. `check_with_vllm_parser` runs the real
parser on the same words for a caller that has vLLM at hand (right before exec).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from hyperqwen.config.keyrule import mask_assignments
from hyperqwen.config.knobs import KNOBS
from hyperqwen.config.spelling import did_you_mean
from hyperqwen.exit_codes import Exit

OPTIONS_FILE = Path(__file__).with_name("vllm_options.json")
KNOB = "EXTRA_ARGS"

# vLLM's CLI spellings of the secrets our knobs pass through the environment: `--api-key` (vllm/entrypoints/
# launchers/cli_args.py; wins over VLLM_API_KEY) and `--hf-token` (vllm/engine/arg_utils.py). Those knobs'
# maps_to say "env ...": a secret never goes on the command line (`ps`, `--print`, logs), so these two flags
# cannot be read from maps_to.
KEY_FLAG = "--api-key"
KEY_KNOBS = ("VLLM_API_KEY", "API_KEY_FILE")
SECRET_FLAGS: dict[str, tuple[str, ...]] = {KEY_FLAG: KEY_KNOBS, "--hf-token": ("HF_TOKEN",)}
# A YAML file of options (FlexibleArgumentParser._pull_args_from_config): it could set any owned option.
CONFIG_FLAG = "--config"
# vLLM options that stop the server from serving HTTP on BIND:PORT, with what they do instead: with them the
# server prints and exits, or listens elsewhere, and BIND, PORT (and the loopback/key decision) go inert.
INERT_DESTS = {
    "help": "prints vLLM's help and exits instead of serving",
    "uds": "listens on a Unix socket, so BIND and PORT are ignored",
    "headless": "starts engines without the API server, so nothing listens on BIND:PORT",
    "grpc": "serves gRPC instead of the HTTP API on BIND:PORT",
    "grpc_port": "opens a gRPC port besides PORT, outside what BIND and the key decision cover",
}

_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")
_FLAG_RE = re.compile(r"--[a-z0-9][a-z0-9-]*")
# argparse's _negative_number_matcher: such a word is a value, not an option (vLLM has no numeric options).
_NEGATIVE_NUMBER_RE = re.compile(r"^-\d+$|^-\d*\.\d+$")
# vLLM's FlexibleArgumentParser.parse_args: underscores become dashes between `--` and the first `.`.
_FLEX_NAME_RE = re.compile(r"(?<=--)[^\.]*")


@dataclass(frozen=True)
class Option:
    """One vLLM option string: the attribute it sets and how many words it takes (argparse nargs:
    0, 1, "?", "*", "+", or a count)."""

    string: str
    dest: str
    nargs: int | str


@dataclass(frozen=True)
class OptionTable:
    version: str
    options: Mapping[str, Option]  # by option string
    positionals: tuple[str, ...]  # dests of positional arguments (vLLM's `model_tag`)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> OptionTable:
        options = {string: Option(string, entry["dest"], entry["nargs"]) for string, entry in data["options"].items()}
        return cls(str(data["vllm"]), options, tuple(data["positionals"]))

    def strings_for(self, dest: str) -> list[str]:
        return sorted(s for s, o in self.options.items() if o.dest == dest)


@lru_cache(maxsize=1)
def option_table() -> OptionTable:
    """The committed table of vLLM 0.32.0's server options."""
    return OptionTable.from_json(json.loads(OPTIONS_FILE.read_text(encoding="utf-8")))


def owned_flags() -> dict[str, tuple[str, ...]]:
    """vLLM flag -> the knobs that set it, from each knob's `maps_to` (plus the secrets' flags).

    A maps_to names vLLM server flags when it starts with one (`--port`, `off: --language-model-only`); the
    flags in its first clause (up to ';') are the knob's. Others drive our tools ("hyperqwen ...",
    "compose: ...", "vllm-router --policy") or the environment ("env ...").
    """
    owners: dict[str, list[str]] = {flag: list(knobs) for flag, knobs in SECRET_FLAGS.items()}
    for knob in KNOBS:
        clause = knob.maps_to.split(";", 1)[0].strip()
        if not clause.removeprefix("off:").strip().startswith("--"):
            continue
        for flag in _FLAG_RE.findall(clause):
            owners.setdefault(flag, [])
            if knob.name not in owners[flag]:
                owners[flag].append(knob.name)
    return {flag: tuple(names) for flag, names in owners.items()}


BUILDER = "HyperQwen's own command line"


def owned_dests(table: OptionTable | None = None, builder_flags: Iterable[str] = ()) -> dict[str, tuple[str, ...]]:
    """vLLM attribute (dest) -> knobs that own it. Every spelling of the same option shares its dest
    (`--enable-prefix-caching` and `--no-enable-prefix-caching` both set enable_prefix_caching).

    builder_flags: the flags the argv builder emitted for these settings; one that no knob's maps_to names
    is owned by the builder itself."""
    table = table or option_table()
    flags = owned_flags()
    for flag in builder_flags:
        if flag.startswith("--") and flag not in flags:
            flags[flag] = (BUILDER,)
    dests: dict[str, tuple[str, ...]] = {}
    for flag, knobs in flags.items():
        option = table.options.get(flag)
        if option is None:  # a knob naming a flag vLLM lacks is a bug in knobs.py, caught by a unit test
            continue
        dests[option.dest] = tuple(dict.fromkeys(dests.get(option.dest, ()) + knobs))
    return dests


# --- resolution ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Word:
    """What one word of EXTRA_ARGS is to vLLM's parser."""

    index: int
    text: str
    kind: str  # "option" | "value" | "positional" | "unknown" | "ambiguous" | "control" | "flag-with-value"
    dest: str | None = None
    option: str | None = None  # the canonical option string it resolved to
    candidates: tuple[str, ...] = ()

    def shown(self) -> str:
        """The word as safe to print: what follows '=' is never shown (it may be a key)."""
        name, sep, _ = self.text.partition("=")
        shown = name + ("=..." if sep else "")
        return shown if len(shown) <= 60 else shown[:57] + "..."


def _looks_like_option(word: str) -> bool:
    return word.startswith("-") and len(word) > 1 and not _NEGATIVE_NUMBER_RE.match(word)


def _flex_name(word: str) -> str:
    """FlexibleArgumentParser's renaming of a `--name[=value]` word."""
    if "=" in word:
        key, value = word.split("=", 1)
        return _FLEX_NAME_RE.sub(lambda m: m.group(0).replace("_", "-"), key, count=1) + "=" + value
    return _FLEX_NAME_RE.sub(lambda m: m.group(0).replace("_", "-"), word, count=1)


def _match(table: OptionTable, text: str) -> tuple[list[Option], str | None]:
    """argparse's _parse_optional/_get_option_tuples (allow_abbrev on): the options `text` may mean, and the
    value attached with '=' (or, for a short option, glued on: `-tp2`)."""
    if text in table.options:
        return [table.options[text]], None
    if "=" in text:
        name, attached = text.split("=", 1)
        if name in table.options:
            return [table.options[name]], attached
    else:
        name, attached = text, None
    if text.startswith("--"):
        prefix = name
        found = [o for s, o in table.options.items() if s.startswith(prefix)]
    else:
        # A single dash: `-x` glued to its value, or a prefix of a longer single-dash option.
        found = [
            o for s, o in table.options.items() if s == text[:2] or (s.startswith(text) and not s.startswith("--"))
        ]
        if len(found) == 1 and found[0].string == text[:2] and attached is None:
            attached = text[2:] or None
    # Several spellings of one option (same dest) are one match, as argparse keys them by action.
    by_dest = {o.dest: o for o in sorted(found, key=lambda o: (o.string.startswith("--no-"), len(o.string)))}
    return list(by_dest.values()), attached


def resolve(words: Sequence[str], table: OptionTable | None = None) -> list[Word]:
    """Classify each word as vLLM's parser would see it (EXTRA_ARGS comes after our own flags, and our argv
    ends with a complete option, so EXTRA_ARGS starts with a fresh parse state)."""
    table = table or option_table()
    result: list[Word] = []
    i = 0
    only_positionals = False
    while i < len(words):
        word = words[i]
        if _CONTROL_RE.search(word):
            result.append(Word(i, word, "control"))
            i += 1
            continue
        if only_positionals or not _looks_like_option(word):
            result.append(Word(i, word, "positional"))
            i += 1
            continue
        if word == "--":  # argparse: everything after it is positional
            only_positionals = True
            result.append(Word(i, word, "positional"))
            i += 1
            continue
        text = word
        dotted = False
        if word.startswith("--"):
            text = _flex_name(word)
            name = text.split("=", 1)[0]
            if "." in name:  # --json-flag.key[+][=value]: JSON for --json-flag, the value always taken
                dotted = True
                base = name.split(".", 1)[0]
                text = base
        elif word.startswith("-O") and word != "-O":  # vLLM: -O3, -O=3 are --optimization-level
            text = "--optimization-level=" + (word[3:] if word[2:3] == "=" else word[2:])
        elif word == "-O" and i + 1 < len(words) and words[i + 1] in {"0", "1", "2", "3"}:
            text = "--optimization-level"
        matches, attached = _match(table, text)
        if not matches:
            result.append(Word(i, word, "unknown"))
            i += 1
            continue
        if len(matches) > 1:
            result.append(Word(i, word, "ambiguous", candidates=tuple(sorted(o.string for o in matches))))
            i += 1
            continue
        option = matches[0]
        result.append(Word(i, word, "option", option.dest, option.string))
        i += 1
        if dotted:
            if "=" not in word:
                if i < len(words):
                    result.append(Word(i, words[i], "value", option.dest))
                i += 1
            continue
        if attached is not None:
            if option.nargs in (0, "0"):  # argparse: "ignored explicit argument" (`--enforce-eager=1`)
                result[-1] = Word(result[-1].index, word, "flag-with-value", option.dest, option.string)
            continue
        nargs = option.nargs
        if nargs in (0, "0"):
            continue
        if nargs in (1, "1", "?", None):
            if i < len(words) and not _looks_like_option(words[i]) and not only_positionals:
                result.append(Word(i, words[i], "value", option.dest))
                i += 1
            continue
        if isinstance(nargs, int):
            for _ in range(nargs):
                if i < len(words) and not _looks_like_option(words[i]):
                    result.append(Word(i, words[i], "value", option.dest))
                    i += 1
            continue
        while i < len(words) and not _looks_like_option(words[i]):  # "*" / "+"
            result.append(Word(i, words[i], "value", option.dest))
            i += 1
    return result


# --- the check -------------------------------------------------------------------------------------------


def _knob_hint(knobs: Iterable[str]) -> str:
    names = list(knobs)
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def problems_in(words: Sequence[str], table: OptionTable | None = None, builder_flags: Iterable[str] = ()) -> list[str]:
    """One message per refused word (empty when EXTRA_ARGS is acceptable). Never shows a value."""
    table = table or option_table()
    owned = owned_dests(table, builder_flags)
    config_dest = table.options[CONFIG_FLAG].dest if CONFIG_FLAG in table.options else None
    messages: list[str] = []
    for word in resolve(words, table):
        where = f"word {word.index + 1} {word.shown()!r}"
        if word.kind == "control":
            messages.append(
                f"{where} contains a control character (a newline or tab?); write EXTRA_ARGS on one "
                "line, words separated by spaces"
            )
        elif word.kind == "positional":
            hint = " (`--` ends vLLM's options; nothing may follow it here)" if word.text == "--" else ""
            messages.append(
                f"{where} is not an option or an option's value: vLLM would take it as its positional "
                f"model_tag and ignore it{hint}; the model is set with MODEL, and every word here must "
                "belong to a --flag"
            )
        elif word.kind == "unknown":
            name = word.text.split("=", 1)[0]
            guess = did_you_mean(_flex_name(name), [s for s in table.options if s.startswith("--")])
            messages.append(
                f"{where} is not a vLLM {table.version} option"
                + (
                    f"; did you mean {guess}?"
                    if guess
                    else "; `python -m vllm.entrypoints.openai.api_server --help` lists them"
                )
            )
        elif word.kind == "ambiguous":
            owners = [owned[table.options[c].dest] for c in word.candidates if table.options[c].dest in owned]
            shown = ", ".join(word.candidates[:6]) + (", ..." if len(word.candidates) > 6 else "")
            extra = (
                f"; some of them are set by HyperQwen: use {_knob_hint(k for o in owners for k in o)}" if owners else ""
            )
            messages.append(
                f"{where} is an abbreviation that matches several vLLM options ({shown}); spell the option out{extra}"
            )
        elif word.kind == "flag-with-value":
            messages.append(
                f"{where} gives a value to {word.option}, which takes none (vLLM would refuse it at start); "
                f"write {word.option} alone to turn it on"
            )
        elif word.kind == "option" and word.dest in INERT_DESTS:
            messages.append(
                f"{where} ({word.option}) {INERT_DESTS[word.dest]}; HyperQwen serves the HTTP API on BIND:PORT, "
                "so it cannot be passed in EXTRA_ARGS"
            )
        elif word.kind == "option" and word.dest in owned:
            knobs = owned[word.dest]
            same = "" if word.text.split("=", 1)[0] == word.option else f" (vLLM reads it as {word.option})"
            secret = {table.options[f].dest for f in SECRET_FLAGS if f in table.options}
            why = " and a secret on the command line shows in `ps`, `--print` and logs" if word.dest in secret else ""
            if knobs == (BUILDER,):
                messages.append(f"{where}{same} is set by {BUILDER}; it cannot be overridden here")
            else:
                messages.append(
                    f"{where}{same} is set by HyperQwen from {_knob_hint(knobs)}{why}; "
                    f"set {_knob_hint(knobs)} instead of passing it in EXTRA_ARGS"
                )
        elif word.kind == "option" and word.dest == config_dest:
            messages.append(
                f"{where} ({CONFIG_FLAG}) loads options from a file, which could set "
                "the ones HyperQwen owns; put the options in EXTRA_ARGS itself"
            )
    return messages


def check_extra_args(words: Sequence[str], raw: str | None = None, builder_flags: Iterable[str] = ()) -> list[str]:
    """Messages for EXTRA_ARGS (parsed words, and the raw text when known, for control characters shlex
    would have silently turned into separators). builder_flags: what the argv builder emits besides."""
    messages: list[str] = []
    if raw is not None and _CONTROL_RE.search(raw.strip()):
        messages.append(
            "contains a control character (a newline or tab?); write EXTRA_ARGS on one line, words separated by spaces"
        )
        words = [w for w in words if not _CONTROL_RE.search(w)]
    return messages + problems_in(words, builder_flags=builder_flags)


def builder_overrides(words: Sequence[str], builder_flags: Iterable[str]) -> list[str]:
    """Messages for the words that set one of `builder_flags` (the flags the argv builder emits on its own,
    declared by launch/command.py), beyond what `problems_in` already says about the knobs' flags."""
    known = set(problems_in(words))
    return [message for message in problems_in(words, builder_flags=builder_flags) if message not in known]


# --- the real parser (needs vLLM) ------------------------------------------------------------------------


def vllm_parser() -> Any:
    """vLLM's server parser as `python -m vllm.entrypoints.openai.api_server` builds it (imports vLLM)."""
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    return make_arg_parser(FlexibleArgumentParser(description="vLLM OpenAI-Compatible RESTful API server."))


def table_from_parser(parser: Any, version: str) -> dict[str, Any]:
    """The JSON table of a live parser: every option string, its dest and nargs; the positionals."""
    options: dict[str, dict[str, Any]] = {}
    positionals: list[str] = []
    for action in parser._actions:
        if not action.option_strings:
            positionals.append(action.dest)
            continue
        nargs: int | str = 1 if action.nargs is None else action.nargs
        for string in action.option_strings:
            options[string] = {"dest": action.dest, "nargs": nargs}
    return {"vllm": version, "options": dict(sorted(options.items())), "positionals": positionals}


_SENTINEL = object()


def dests_set_by_vllm(words: Sequence[str], parser: Any | None = None) -> set[str]:
    """The attributes vLLM's real parser sets from `words`: every dest is pre-filled with a marker argparse leaves
    alone unless an argument sets it (a sentinel; a fresh list for append/extend actions, which copy it; None for
    count actions). Raises SystemExit/ValueError where vLLM refuses the words."""
    import argparse

    parser = parser or vllm_parser()
    markers: dict[str, Any] = {}
    for action in parser._actions:
        if action.dest == "help":
            continue
        if isinstance(action, (argparse._AppendAction, argparse._AppendConstAction, argparse._ExtendAction)):
            markers[action.dest] = []
        elif isinstance(action, argparse._CountAction):
            markers[action.dest] = None
        else:
            markers[action.dest] = _SENTINEL
    parsed = parser.parse_args(list(words), namespace=argparse.Namespace(**markers))
    # argparse always stores an optional positional (`model_tag`, nargs "?"), its default when no word fills it.
    defaults = {a.dest: a.default for a in parser._actions if not a.option_strings}
    return {
        dest
        for dest, value in vars(parsed).items()
        if dest in markers and value is not markers[dest] and not (dest in defaults and value == defaults[dest])
    }


# argparse's error line (`PROG: error: MESSAGE`, after the usage text) and pydantic's link line, which follows
# every validation error and says nothing about this one.
_PARSER_ERROR_RE = re.compile(r"^\S.*?: error: ")
_PYDANTIC_LINK = "For further information visit"
_PYDANTIC_DETAIL_RE = re.compile(r"\s*\[type=[^\]]*\]")


def parser_refusal_reason(stderr: str) -> str:
    """vLLM's reason for refusing, on one line, from what its parser wrote to stderr: argparse's `error:` message
    and what follows it (a config's pydantic ValidationError spans lines: field, then the reason), without the
    usage text before it or pydantic's documentation link. Any value given after '=' is masked: a key passed by
    mistake must not be echoed."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    start = next((i for i, line in enumerate(lines) if _PARSER_ERROR_RE.match(line)), max(len(lines) - 1, 0))
    said = [line for line in lines[start:] if not line.startswith(_PYDANTIC_LINK)]
    message = "; ".join(said)
    message = _PARSER_ERROR_RE.sub("", message, count=1)
    # pydantic's "[type=..., input_value=..., input_type=...]" repeats the value (masked below anyway).
    message = _PYDANTIC_DETAIL_RE.sub("", message)
    return mask_assignments(message)


def check_with_vllm_parser(words: Sequence[str], parser: Any | None = None) -> list[str]:
    """The real parser's verdict on EXTRA_ARGS: owned options it would set, and stray positionals."""
    owned = owned_dests()
    table = option_table()
    import contextlib
    import io

    captured = io.StringIO()
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(captured):
            dests = dests_set_by_vllm(words, parser)
    except SystemExit as exc:
        if exc.code in (0, None):  # --help: vLLM would print it and exit 0 instead of serving
            return ["makes vLLM print its help and exit instead of serving; remove -h/--help"]
        message = parser_refusal_reason(captured.getvalue())
        return ["vLLM's own parser refuses these arguments" + (f": {message}" if message else "")]
    messages = [
        f"sets vLLM's {table.strings_for(d)[-1]}, which HyperQwen sets from {_knob_hint(owned[d])}; "
        f"set {_knob_hint(owned[d])} instead"
        for d in sorted(dests & set(owned))
    ]
    messages += [
        f"sets vLLM's {table.strings_for(d)[-1]}, which {INERT_DESTS[d]}; remove it"
        for d in sorted(dests & set(INERT_DESTS))
    ]
    messages += [
        f"a stray word lands in vLLM's positional {d} (ignored by the server); remove it"
        for d in sorted(dests & set(table.positionals))
    ]
    return messages


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m hyperqwen.config.extra_args --write|--check`: (re)generate the option table from vLLM."""
    import argparse

    import vllm

    cli = argparse.ArgumentParser(description=main.__doc__)
    cli.add_argument("--write", action="store_true", help=f"write {OPTIONS_FILE.name}")
    args = cli.parse_args(argv)
    text = json.dumps(table_from_parser(vllm_parser(), vllm.__version__), indent=1) + "\n"
    if args.write:
        OPTIONS_FILE.write_text(text, encoding="utf-8")
        return Exit.OK
    same = OPTIONS_FILE.is_file() and OPTIONS_FILE.read_text(encoding="utf-8") == text
    print(f"{OPTIONS_FILE.name}: {'up to date' if same else 'differs from the installed vLLM'}")
    return Exit.OK if same else Exit.FAILED


if __name__ == "__main__":
    sys.exit(main())


def argv_value(args: Sequence[str], flag: str) -> str | None:
    """The value of `flag` in a vLLM argv (`--flag=value` or `--flag value`), the last one winning; else None."""
    found = None
    for i, word in enumerate(args):
        if word.startswith(flag + "="):
            found = word[len(flag) + 1 :]
        elif word == flag and i + 1 < len(args):
            found = args[i + 1]
    return found
