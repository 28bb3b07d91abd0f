"""The shipped docs/nginx-auth-request.conf's checks before the auth subrequest (a bad
path, a "|" in Authorization) are worked out once a request, through a real nginx in
front of a real `keysvc serve`. The auth subrequest starts again at the server block's
rewrite phase: a regex `if` there ran its regex a second time for it, on every request,
a reused answer included (docs/PERFORMANCE.md, "Forward auth's reuse after issue 35").
Seen in nginx's own debug log (Debian's nginx is built --with-debug): a regex `if` logs
'"<regex>" does not match "<value>"' (or "matches"), a map 'http map: "<value>" ...'.
What the checks refuse is tested in test_nginx_hostile.py and test_nginx.py.
"""

import re
from contextlib import ExitStack
from pathlib import Path

from tests.nginx import CLIENT, call
from tests.nginxstack import ENV, start_stack

# A regex `if` the rewrite module ran, with the value it was run on.
QUOTED = r'"((?:[^"\\]|\\.)*)"'
REGEX_IF = re.compile(QUOTED + r" (?:does not match|matches) " + QUOTED)
MAP = re.compile(r"http map: " + QUOTED + " ")


def test_a_served_request_works_out_each_check_once_and_runs_no_regex_if(
    tmp_path: Path,
) -> None:
    with ExitStack() as resources:
        stack = start_stack(resources, tmp_path, ENV)
        stack.nginx.stop()
        debug = stack.nginx.directory / "debug.log"
        conf = stack.nginx.conf.read_text()
        stack.nginx.conf.write_text(f"error_log {debug} debug;\n{conf}")
        stack.nginx.start()
        key = stack.create_key(roles=["developer"])
        authorization = key.headers["Authorization"]
        for _ in range(2):  # keysvc's answer, then the same answer reused
            start = debug.stat().st_size
            answer = call(stack.nginx.port, "/orders", headers=key.headers, source=CLIENT)
            assert answer.status == 200, answer.body
            with debug.open("rb") as log:
                log.seek(start)
                lines = log.read().decode(errors="replace").splitlines()
            regex_ifs = [m[2] for line in lines if (m := REGEX_IF.search(line))]
            mapped = [m[1] for line in lines if (m := MAP.search(line))]
            # The "|" check of the credentials: once, for the request, not again for
            # its auth subrequest.
            checked = regex_ifs.count(authorization) + mapped.count(authorization)
            assert checked == 1, (regex_ifs, mapped)
            # No regex `if` runs for a served request: the checks are maps, worked out
            # once and kept for the auth subrequest.
            assert regex_ifs == [], regex_ifs
            assert stack.upstream.seen[-1]["path"] == "/orders"
