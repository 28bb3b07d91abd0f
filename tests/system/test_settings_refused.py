"""The real command refuses a port in Arabic-Indic digits and a number of workers past
the bound, each in one line and before it serves anything."""

from pathlib import Path

import pytest

from keysvc.config import MAX_WORKERS
from tests.server import keysvc


@pytest.mark.parametrize(
    ("flags", "line"),
    [
        (
            ("--port", "\u0668\u0660\u0668\u0660"),
            "keysvc: port: '\u0668\u0660\u0668\u0660' is not a number",
        ),
        (("--workers", "100000"), f"keysvc: workers: 100000 must be from 1 to {MAX_WORKERS}"),
    ],
)
def test_serve_refuses_the_setting_in_one_line(
    tmp_path: Path, flags: tuple[str, str], line: str
) -> None:
    done = keysvc("serve", "--db", str(tmp_path / "k.db"), *flags)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [line]
    assert not (tmp_path / "k.db").exists()
