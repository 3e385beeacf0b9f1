"""Item 1: ``eventlane ... APP`` imports the app from the current directory, as uvicorn does;
a path form works under it, and elsewhere the error shows the module:attribute form."""

from __future__ import annotations

from pathlib import Path

from tests.newcomer.kit import error_line, eventlane


def test_app_is_imported_from_the_current_directory(workdir: Path) -> None:
    done = eventlane("--data", "d", "migrate", "library.app:app", cwd=workdir)
    assert done.returncode == 0, done.stderr
    assert "loans_view: applied library.loans:m001_loans" in done.stdout
    for spec in ("library/app.py", "library/app.py:app", "./library/app.py", "library.app"):
        done = eventlane("--data", "d", "project", "status", spec, "--json", cwd=workdir)
        assert done.returncode == 0, (spec, done.stderr)


def test_a_path_outside_the_current_directory_gets_the_module_form(
    workdir: Path, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = eventlane("--data", "d", "migrate", str(workdir / "library" / "app.py"), cwd=elsewhere)
    line = error_line(done)
    assert "library.app:app" in line and str(workdir) in line
    missing = error_line(eventlane("--data", "d", "migrate", "nolib.app:app", cwd=workdir))
    assert "module:attribute" in missing and str(workdir) in missing
