"""Host side: download the lab's wheels (wheels.py) and write them as carry-sized volumes (volumes.py).

    python3 scripts/gpu_lab/pack.py [--out .gpulab] [--volume-size 52MiB]

Writes OUT/wheelhouse/ (wheels, and a GNU patch binary: `hyperqwen patches apply` needs one and a lab host may
lack it) and OUT/vol/p00.. with manifest.json. OUT must be git-ignored (docs/gpu-lab.md).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parents[2] / "src")]

from gpu_lab.volumes import VolumeError, write_volumes  # noqa: E402
from gpu_lab.wheels import LockError, canonical, lab_requirements  # noqa: E402
from hyperqwen.config.sizes import SizeError, parse_size  # noqa: E402

# The lab host's interpreter (CPython 3.12 on x86-64 Linux); pip matches manylinux tags exactly.
PYTHON_VERSION = "3.12"
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in (17, 18, 24, 26, 27, 28, 29, 31, 32, 34, 35)] + ["manylinux2014_x86_64", "any"]


def wheel_name(path: Path) -> str:
    return canonical(path.name.split("-", 1)[0])


def wheel_pin(path: Path) -> str:
    """name==version of a wheel file (PEP 427: {name}-{version}-...; the name has no '-')."""
    name, version = path.name.split("-")[:2]
    return f"{canonical(name)}=={version}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(".gpulab"))
    # 52 MiB: a call carries 64 MiB, and the first volume travels with the working tree (~4 MiB) and the manifest.
    parser.add_argument("--volume-size", default="52MiB")
    args = parser.parse_args(argv)
    try:
        size = parse_size(args.volume_size)
    except SizeError as exc:
        print(f"pack: --volume-size {args.volume_size!r} {exc}", file=sys.stderr)
        return 2
    try:
        requirements = lab_requirements()
    except LockError as exc:
        print(f"pack: {exc}", file=sys.stderr)
        return 2
    house = args.out / "wheelhouse"
    (house / "bin").mkdir(parents=True, exist_ok=True)
    req = args.out / "lab-requirements.txt"
    req.write_text("\n".join(requirements) + "\n")
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
               "--python-version", PYTHON_VERSION, "--implementation", "cp", *platforms, "-d", str(house),
               "-r", str(req)]
    if subprocess.run(command).returncode != 0:
        print("pack: pip download failed (above); is PyPI reachable?", file=sys.stderr)
        return 1
    # One version of each package: a wheel an earlier pin left behind would make pip refuse the install.
    wanted = {canonical(r.split("==")[0]) + "==" + r.split("==")[1] for r in requirements}
    for stale in [w for w in house.glob("*.whl") if wheel_pin(w) not in wanted]:
        stale.unlink()
    wheels = sorted(house.glob("*.whl"))
    missing = wanted - {wheel_pin(w) for w in wheels}
    if missing:
        print(f"pack: no wheel downloaded for {', '.join(sorted(missing))}", file=sys.stderr)
        return 1
    patch = shutil.which("patch")
    if patch is None:
        print("pack: GNU patch is not installed here (apt-get install patch): the lab host needs a copy",
              file=sys.stderr)
        return 2
    shutil.copy2(patch, house / "bin" / "patch")
    try:
        manifest = write_volumes([*wheels, house / "bin" / "patch"], args.out / "vol", size, root=house)
    except VolumeError as exc:
        print(f"pack: {exc}", file=sys.stderr)
        return 2
    total = manifest["tar_bytes"] / 2**20
    print(f"pack: {len(wheels)} wheels, {total:,.0f} MiB in {len(manifest['volumes'])} volumes under "
          f"{args.out / 'vol'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
