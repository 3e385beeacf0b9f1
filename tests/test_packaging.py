"""What installing puts into site-packages: the eventlane wheel holds only ``eventlane`` (with
``py.typed``) and no plugin of the sample app; the sample app is a distribution of its own
that brings its ``eventlane invoicing`` commands (built here with pip, as a user would)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SKIP = shutil.ignore_patterns("__pycache__", "*.so", "build", "*.egg-info")


def build_wheel(files: list[str], tmp_path: Path, project: str = ".") -> zipfile.ZipFile:
    """A wheel built by pip from a copy of ``files`` (pip builds in the source tree)."""
    source, out = tmp_path / "src", tmp_path / "dist"
    source.mkdir(parents=True)
    for name in files:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=SKIP)
        else:
            shutil.copy2(ROOT / name, source / name)
    pip = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation"]
    subprocess.run(
        [*pip, "--wheel-dir", str(out), str(source / project)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = out.glob("*.whl")
    return zipfile.ZipFile(wheel)


def entry_points(wheel: zipfile.ZipFile) -> str:
    (name,) = [n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt")]
    return wheel.read(name).decode()


def test_the_eventlane_wheel_installs_only_framework(tmp_path: Path) -> None:
    wheel = build_wheel(["pyproject.toml", "setup.py", "README.md", "eventlane"], tmp_path)
    tops = {name.split("/")[0] for name in wheel.namelist()}
    assert tops == {"eventlane", "eventlane-0.1.0.dist-info"}
    names = set(wheel.namelist())
    assert "eventlane/py.typed" in names
    assert "eventlane/testing/contracts.py" in names  # the shipped log contract kit
    assert "eventlane/projection/system_tables.py" in names  # the framework's own schema
    assert {
        "eventlane/console/templates/base.html",
        "eventlane/console/static/htmx.min.js",
    } <= names
    assert not any(n.startswith(("migrations/", "example_apps/")) for n in names)
    assert entry_points(wheel).split() == [
        "[console_scripts]",
        "eventlane",
        "=",
        "eventlane.cli:main",
        "[eventlane.engines]",  # the framework's own engine adapters (loaded on demand)
        "kafka",
        "=",
        "eventlane.log.kafka.log:open_url",
        "nats",
        "=",
        "eventlane.log.jetstream.log:open_url",
    ]


def test_the_sample_app_is_a_distribution_of_its_own(tmp_path: Path) -> None:
    wheel = build_wheel(["example_apps"], tmp_path, project="example_apps")
    tops = {name.split("/")[0] for name in wheel.namelist()}
    assert tops == {"example_apps", "eventlane_example_apps-0.1.0.dist-info"}
    assert "example_apps/invoicing/migrations.py" in wheel.namelist()
    points = entry_points(wheel)
    assert "invoicing = example_apps.invoicing.cli:invoicing" in points
    assert "invoicing = example_apps.invoicing.cli:demo" in points
