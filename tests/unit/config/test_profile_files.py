"""A missing or broken profile file is one line naming it, never a traceback."""

from __future__ import annotations

import pytest

from hyperqwen.config.settings import SettingsError, load_profile


def test_missing_profile_names_the_file(tmp_path):
    path = tmp_path / "single-user" / "profile.yaml"
    with pytest.raises(SettingsError) as caught:
        load_profile("single", path)
    (problem,) = caught.value.problems
    assert str(path) in problem.message and "cannot be read" in problem.message and "\n" not in problem.message


def test_broken_yaml_names_the_file_and_line(tmp_path):
    path = tmp_path / "profile.yaml"
    path.write_text("mode: single\ndefaults:\n  SPEC: [mtp\n")
    with pytest.raises(SettingsError, match=r"profile.yaml: the single profile is not valid YAML at line \d"):
        load_profile("single", path)
