"""The systemd unit's IP filter (``IPAddressAllow=``/``IPAddressDeny=``, which the kernel
applies to packets in both directions): webhook deliveries to public receivers get
through, the cloud metadata address and private ranges stay refused, and the lines the
unit tells an operator to add for a PostgreSQL server, a DNS server or a proxy on a
private network keep the unit valid for ``systemd-analyze verify``. The filter is
evaluated as systemd documents it: an allowed address wins over a denied one, and one
in neither list is allowed."""

import ipaddress
import re
import subprocess
from pathlib import Path

import pytest

from tests.components import require_command

UNIT = Path(__file__).resolve().parents[2] / "docs" / "keysvc.service"
# systemd's names for address sets (systemd.resource-control(5)).
NAMED = {
    "any": ["0.0.0.0/0", "::/0"],
    "localhost": ["127.0.0.0/8", "::1/128"],
    "link-local": ["169.254.0.0/16", "fe80::/64"],
    "multicast": ["224.0.0.0/4", "ff00::/8"],
}


def entries(unit: str, directive: str) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    found = []
    for line in re.findall(rf"^{directive}=(.*)$", unit, re.M):
        for item in line.split():
            found += [ipaddress.ip_network(n) for n in NAMED.get(item, [item])]
    return found


def allowed(unit: str, address: str) -> bool:
    ip = ipaddress.ip_address(address)
    if any(ip in network for network in entries(unit, "IPAddressAllow")):
        return True
    return not any(ip in network for network in entries(unit, "IPAddressDeny"))


@pytest.mark.parametrize(
    "address", ["93.184.215.14", "2606:2800:21f:cb07:6820:80da:af6b:8b2c", "127.0.0.1", "::1"]
)
def test_public_receivers_and_this_machine_are_reached(address: str) -> None:
    assert allowed(UNIT.read_text(), address)


@pytest.mark.parametrize(
    "address",
    ["169.254.169.254", "fd00:ec2::254", "10.0.0.2", "172.16.5.4", "192.168.1.1", "100.64.0.1",
     "fe80::1", "224.0.0.251", "0.0.0.0"],
)  # fmt: skip
def test_metadata_and_private_ranges_stay_refused(address: str) -> None:
    assert not allowed(UNIT.read_text(), address)


def test_the_documented_line_for_a_private_database_passes_verify(tmp_path: Path) -> None:
    """The unit names the line to add for a PostgreSQL server (or DNS server, or proxy)
    on a private network; with it added, that address is reached and the unit is still
    valid."""
    text = UNIT.read_text()
    (suggested,) = re.findall(r"^#\s*(IPAddressAllow=localhost 10\.0\.0\.5)$", text, re.M)
    assert "PostgreSQL" in text and "resolv.conf" in text
    changed = re.sub(r"^IPAddressAllow=.*$", suggested, text, flags=re.M)
    assert allowed(changed, "10.0.0.5") and not allowed(changed, "10.0.0.6")
    unit = tmp_path / "keysvc.service"
    unit.write_text(changed)
    analyze = require_command("systemd-analyze", package="systemd")
    verify = subprocess.run(
        [analyze, "verify", str(unit)], capture_output=True, text=True, check=False
    )
    assert (verify.returncode, verify.stdout + verify.stderr) == (0, "")
