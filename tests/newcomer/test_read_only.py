"""Item 7: a read-only data directory (a read-only bind mount, made in a private mount
namespace with ``unshare``) can be inspected; commands that must write say so."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

from tests.newcomer.kit import EVENTLANE, child_env, eventlane, seed

READING = {
    "topics_list": "topics list",
    "topics_describe": "topics describe loans",
    "consume": "consume loans --max 3",
    "dump": "dump d/topics/loans/0/00000000000000000000.log",
    "verify": "verify",
    "status": "project status library.app:app --json",
    "dlq_list": "dlq list library.app:app -p loans_view",
}
WRITING = {
    "produce": "produce loans",
    "group_consume": "consume loans --group g --max 1",
    "migrate": "migrate library.app:app",
}


def test_inspection_works_on_a_read_only_mount(workdir: Path) -> None:
    assert eventlane("--data", "d", "migrate", "library.app:app", cwd=workdir).returncode == 0
    seed(workdir, 10)
    lines = [
        "mount --bind d d",
        "mount -o remount,bind,ro d",
        "touch d/probe 2>/dev/null && exit 9",
    ]
    for name, args in {**READING, **WRITING}.items():
        lines.append(
            f"echo x | {shlex.quote(str(EVENTLANE))} --data d {args} > {name}.out 2> {name}.err;"
            f" echo $? > {name}.rc"
        )
    done = subprocess.run(
        ["unshare", "-rm", "sh", "-c", "\n".join(lines)],
        cwd=workdir,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, (done.returncode, done.stderr)  # 9: the mount was writable

    def result(name: str) -> tuple[int, str, str]:
        rc = int((workdir / f"{name}.rc").read_text())
        return rc, (workdir / f"{name}.out").read_text(), (workdir / f"{name}.err").read_text()

    for name in READING:
        rc, _out, err = result(name)
        assert rc == 0, (name, err)
        assert "Traceback" not in err
    assert result("consume")[1].count('"topic":"loans"') == 3
    assert '"lag": 10' in result("status")[1]
    assert "key indexes not checked: the data directory is read-only" in result("verify")[2]
    for name in WRITING:
        rc, _out, err = result(name)
        errors = [line for line in err.splitlines() if line.startswith("Error:")]
        assert rc == 1 and len(errors) == 1, (name, err)
        assert "read-only" in errors[0], errors[0]
    assert not (workdir / "d" / "probe").exists()
