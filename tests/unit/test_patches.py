"""hyperqwen.patches against throwaway patches on a temp tree, with the real GNU patch."""

from __future__ import annotations

import difflib
import shutil
from pathlib import Path

import pytest

from hyperqwen import patches as hp

pytestmark = pytest.mark.skipif(shutil.which("patch") is None, reason="needs GNU patch (apt-get install patch)")

ORIGINAL_A = "".join(f"line {i}\n" for i in range(1, 21))
ORIGINAL_B = "def f():\n    return 1\n"


def make_diff(rel: str, old: str | None, new: str | None) -> str:
    """A unified diff with a/ b/ prefixes, the way `git diff` writes one (None = file absent)."""
    fromfile = f"a/{rel}" if old is not None else "/dev/null"
    tofile = f"b/{rel}" if new is not None else "/dev/null"
    return "".join(
        difflib.unified_diff(
            (old or "").splitlines(keepends=True), (new or "").splitlines(keepends=True), fromfile, tofile
        )
    )


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A stand-in site-packages with a tiny vllm/ package."""
    target = tmp_path / "site-packages"
    (target / "vllm").mkdir(parents=True)
    (target / "vllm" / "a.py").write_text(ORIGINAL_A)
    (target / "vllm" / "b.py").write_text(ORIGINAL_B)
    return target


@pytest.fixture
def pdir(tmp_path: Path) -> Path:
    d = tmp_path / "patches"
    d.mkdir()
    return d


def write_series(pdir: Path, text: str) -> None:
    (pdir / "series").write_text(text)


def a_with(line: int, text: str, base: str = ORIGINAL_A) -> str:
    lines = base.splitlines(keepends=True)
    lines[line - 1] = text
    return "".join(lines)


def snapshot(target: Path) -> dict[str, str]:
    return {str(p.relative_to(target)): p.read_text() for p in sorted(target.rglob("*")) if p.is_file()}


def test_apply_then_check_passes_and_changes_files(tree: Path, pdir: Path) -> None:
    (pdir / "0001-a.patch").write_text(make_diff("vllm/a.py", ORIGINAL_A, a_with(10, "line ten\n")))
    (pdir / "0002-b.patch").write_text(make_diff("vllm/b.py", ORIGINAL_B, "def f():\n    return 2\n"))
    write_series(pdir, "0001-a.patch\n0002-b.patch\n")
    series = hp.read_series(pdir)
    assert [p.name for p in series] == ["0001-a.patch", "0002-b.patch"]
    assert series[0].files == ("vllm/a.py",)

    assert [r.applied for r in hp.check_series(series, tree)] == [False, False]
    hp.apply_series(series, tree)
    assert (tree / "vllm" / "a.py").read_text() == a_with(10, "line ten\n")
    assert (tree / "vllm" / "b.py").read_text().endswith("return 2\n")
    results = hp.check_series(series, tree)
    assert [r.applied for r in results] == [True, True]
    # No backup or reject files were left behind.
    assert sorted(snapshot(tree)) == ["vllm/a.py", "vllm/b.py"]


def test_check_reports_only_the_missing_patch(tree: Path, pdir: Path) -> None:
    (pdir / "0001-a.patch").write_text(make_diff("vllm/a.py", ORIGINAL_A, a_with(3, "three\n")))
    (pdir / "0002-b.patch").write_text(make_diff("vllm/b.py", ORIGINAL_B, "def f():\n    return 2\n"))
    write_series(pdir, "0001-a.patch\n0002-b.patch\n")
    series = hp.read_series(pdir)
    hp.apply_series(series[:1], tree)
    results = hp.check_series(series, tree)
    assert [(r.patch.name, r.applied) for r in results] == [("0001-a.patch", True), ("0002-b.patch", False)]
    assert "b.py" in results[1].detail


def test_check_rejects_a_hand_edit_that_looks_similar(tree: Path, pdir: Path) -> None:
    """A file edited to contain the patch's new line but with different context is not 'applied'."""
    (pdir / "0001-a.patch").write_text(make_diff("vllm/a.py", ORIGINAL_A, a_with(10, "line ten\n")))
    write_series(pdir, "0001-a.patch\n")
    series = hp.read_series(pdir)
    hp.apply_series(series, tree)
    edited = a_with(9, "line nine, edited by hand\n", (tree / "vllm" / "a.py").read_text())
    (tree / "vllm" / "a.py").write_text(edited)
    assert "line ten\n" in edited
    [result] = hp.check_series(series, tree)
    assert not result.applied
    assert (tree / "vllm" / "a.py").read_text() == edited  # check never writes the target


def test_failing_hunk_changes_nothing_and_names_the_patch(tree: Path, pdir: Path) -> None:
    (pdir / "0001-good.patch").write_text(make_diff("vllm/b.py", ORIGINAL_B, "def f():\n    return 2\n"))
    # Made against a different a.py: its context does not match the tree.
    other = a_with(5, "something else\n")
    (pdir / "0002-bad.patch").write_text(make_diff("vllm/a.py", other, a_with(6, "six\n", other)))
    write_series(pdir, "0001-good.patch\n0002-bad.patch\n")
    before = snapshot(tree)
    with pytest.raises(hp.PatchError) as err:
        hp.apply_series(hp.read_series(pdir), tree)
    assert "0002-bad.patch" in str(err.value)
    assert "series line 2" in str(err.value)
    assert "FAILED" in str(err.value)  # GNU patch's own hunk output is passed on
    assert snapshot(tree) == before  # the good patch before it was not applied either


def test_fuzz_zero_refuses_a_patch_that_default_fuzz_would_take(tree: Path, pdir: Path) -> None:
    """The first context line differs: plain `patch` (fuzz 2) would apply it, fuzz 0 must not."""
    made_on = a_with(7, "line 7 (older)\n")
    (pdir / "0001-fuzzy.patch").write_text(make_diff("vllm/a.py", made_on, a_with(10, "ten\n", made_on)))
    write_series(pdir, "0001-fuzzy.patch\n")
    with pytest.raises(hp.PatchError, match="0001-fuzzy.patch"):
        hp.apply_series(hp.read_series(pdir), tree)
    assert (tree / "vllm" / "a.py").read_text() == ORIGINAL_A


def test_series_order_matters_for_dependent_patches(tree: Path, pdir: Path) -> None:
    step1 = a_with(10, "line ten\n")
    step2 = a_with(10, "line TEN\n")
    (pdir / "0001-first.patch").write_text(make_diff("vllm/a.py", ORIGINAL_A, step1))
    (pdir / "0002-second.patch").write_text(make_diff("vllm/a.py", step1, step2))

    write_series(pdir, "0002-second.patch\n0001-first.patch\n")
    with pytest.raises(hp.PatchError, match="0002-second.patch"):
        hp.apply_series(hp.read_series(pdir), tree)
    assert (tree / "vllm" / "a.py").read_text() == ORIGINAL_A

    write_series(pdir, "0001-first.patch\n0002-second.patch\n")
    series = hp.read_series(pdir)
    hp.apply_series(series, tree)
    assert (tree / "vllm" / "a.py").read_text() == step2
    # The check reverses the second before the first, so both prove applied.
    assert [r.applied for r in hp.check_series(series, tree)] == [True, True]


def test_new_and_deleted_files(tree: Path, pdir: Path) -> None:
    (pdir / "0001-new.patch").write_text(
        make_diff("vllm/extra/new.py", None, "X = 1\n") + make_diff("vllm/b.py", ORIGINAL_B, None)
    )
    write_series(pdir, "0001-new.patch\n")
    series = hp.read_series(pdir)
    assert series[0].files == ("vllm/extra/new.py", "vllm/b.py")
    hp.apply_series(series, tree)
    assert (tree / "vllm" / "extra" / "new.py").read_text() == "X = 1\n"
    assert not (tree / "vllm" / "b.py").exists()
    assert [r.applied for r in hp.check_series(series, tree)] == [True]


def test_series_comments_blank_lines(tree: Path, pdir: Path) -> None:
    (pdir / "0001-a.patch").write_text(make_diff("vllm/a.py", ORIGINAL_A, a_with(1, "one\n")))
    (pdir / "unused.patch").write_text(make_diff("vllm/b.py", ORIGINAL_B, "x = 0\n"))
    write_series(pdir, "# header comment\n\n   \n0001-a.patch   # trailing comment\n# unused.patch\n")
    series = hp.read_series(pdir)
    assert [(p.name, p.series_line) for p in series] == [("0001-a.patch", 4)]


@pytest.mark.parametrize(
    ("series_text", "message"),
    [
        ("0001-a.patch -p0\n", "more than one word"),
        ("0001-a.patch\n0001-a.patch\n", "listed twice"),
        ("missing.patch\n", "does not exist"),
        ("../outside.patch\n", "must be relative"),
        ("/abs.patch\n", "must be relative"),
    ],
)
def test_bad_series_lines_are_named(pdir: Path, series_text: str, message: str) -> None:
    (pdir / "0001-a.patch").write_text(make_diff("vllm/a.py", ORIGINAL_A, a_with(1, "one\n")))
    write_series(pdir, series_text)
    with pytest.raises(hp.PatchError, match=message) as err:
        hp.read_series(pdir)
    assert "series, line" in str(err.value)


def test_patch_paths_must_stay_inside_the_target(pdir: Path) -> None:
    (pdir / "evil.patch").write_text("--- a/../etc/x\n+++ b/../etc/x\n@@ -1 +1 @@\n-a\n+b\n")
    write_series(pdir, "evil.patch\n")
    with pytest.raises(hp.PatchError, match="stay inside"):
        hp.read_series(pdir)


def test_not_a_diff_is_refused(pdir: Path) -> None:
    (pdir / "notes.patch").write_text("just words\n")
    write_series(pdir, "notes.patch\n")
    with pytest.raises(hp.PatchError, match="unified diff"):
        hp.read_series(pdir)


def test_missing_target_is_named(tmp_path: Path, pdir: Path) -> None:
    write_series(pdir, "")
    with pytest.raises(hp.PatchError, match="not a directory"):
        hp.check_series([], tmp_path / "nope")


def test_cli_apply_check_list(tree: Path, pdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (pdir / "0001-a.patch").write_text(make_diff("vllm/a.py", ORIGINAL_A, a_with(2, "two\n")))
    write_series(pdir, "0001-a.patch\n")
    common = ["--patches-dir", str(pdir)]
    assert hp.main(["check", *common, "--target", str(tree)]) == 1
    assert "FAIL 0001-a.patch is not applied" in capsys.readouterr().out
    assert hp.main(["apply", *common, "--target", str(tree)]) == 0
    assert "PASS applied 0001-a.patch" in capsys.readouterr().out
    assert hp.main(["apply", *common, "--target", str(tree)]) == 0  # idempotent
    assert "already applied" in capsys.readouterr().out
    assert hp.main(["check", *common, "--target", str(tree)]) == 0
    assert "PASS 0001-a.patch is applied exactly" in capsys.readouterr().out
    assert hp.main(["list", *common]) == 0
    assert "0001-a.patch  (vllm/a.py)" in capsys.readouterr().out


def test_cli_failure_exit_code_and_message(tree: Path, pdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    other = a_with(5, "different\n")
    (pdir / "0001-bad.patch").write_text(make_diff("vllm/a.py", other, a_with(5, "x\n", other)))
    write_series(pdir, "0001-bad.patch\n")
    assert hp.main(["apply", "--patches-dir", str(pdir), "--target", str(tree)]) == 1
    err = capsys.readouterr().err
    assert "FAIL patch 0001-bad.patch" in err and "nothing was changed" in err


def test_repo_series_parses() -> None:
    """The committed patches/series is well-formed and every listed patch has a LEDGER entry."""
    repo_patches = Path(__file__).resolve().parents[2] / "patches"
    series = hp.read_series(repo_patches)
    ledger = (repo_patches / "LEDGER.md").read_text()
    for p in series:
        assert p.name in ledger, f"{p.name} has no entry in patches/LEDGER.md"
