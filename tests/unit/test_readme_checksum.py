"""The checksum function for scanners (docs/concepts/leaks.md, moved from the README)
agrees with keysvc's own secrets."""

import re
from pathlib import Path
from typing import Any

from keysvc.credentials import new_secret

# The scanner patterns moved from the PAGE to the docs site (issue 38).
PAGE = Path(__file__).resolve().parents[2] / "docs" / "concepts" / "leaks.md"


def test_the_readmes_checksum_rule_tells_secrets_from_look_alikes() -> None:
    (snippet,) = re.findall(r"```python3\n(.*?)```", PAGE.read_text(), re.S)
    names: dict[str, Any] = {}
    exec(snippet, names)  # the page's own example, run as a reader would
    is_secret = names["is_keysvc_secret"]
    for _ in range(200):
        secret = new_secret()
        assert is_secret(secret)
        flipped = secret[:10] + ("A" if secret[10] != "A" else "B") + secret[11:]
        assert not is_secret(flipped)
    assert is_secret(new_secret("acme_live_"), "acme_live_")
    assert not is_secret(new_secret("acme_live_"))
