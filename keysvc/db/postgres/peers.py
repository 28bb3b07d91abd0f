"""How keysvc instances sharing a PostgreSQL database know each other without taking
any session's word for it: any role that may connect can LISTEN, NOTIFY and read
``pg_stat_activity``'s names, so neither a channel's payload nor an
``application_name`` proves anything.

- An instance's listening connection registers in ``listeners`` (its instance name,
  ``pg_backend_pid()`` and ``backend_start``), a table only keysvc's role may write.
  The instances listening now are the registered rows whose server process is live
  (same pid, same start), as the role the instances share sees them; rows of ended
  processes are ignored, and removed by the next instance to register.
- An acknowledgement on keysvc_seen carries an HMAC of its instance and generation,
  keyed by a key derived from the pepper (``keysvc.credentials.PEER_ACKNOWLEDGEMENTS``);
  one whose MAC fails is dropped.
"""

import hashlib
import hmac

# This connection's row, as pg_stat_activity knows its server process.
REGISTER = (
    "insert into listeners (instance, pid, backend_start)"
    " select $1, pid, backend_start from pg_stat_activity where pid = pg_backend_pid()"
    " on conflict (instance) do update"
    " set pid = excluded.pid, backend_start = excluded.backend_start"
)
# The application_name of an instance's listening connection: this and its instance.
LISTENER_PREFIX = "keysvc-listen/"
# A listeners row whose server process is live, as pg_stat_activity ``a`` shows it: the
# same pid and start. A role outside the process's role and pg_read_all_stats sees its
# start as NULL; for it, the same pid and the instance's own application_name (which
# every role sees) stand in. That is how a command run as another role, or an instance
# behind a pooler that logs in as another role, finds the instances to wait for: it
# found none, and a key it revoked was served on by another instance (rt65 F1); and
# how such a role's clean-up tells a live row from an ended one (rt64 F2).
_LIVE = (
    "a.pid = l.pid and (a.backend_start = l.backend_start or (a.backend_start is null"
    f" and a.application_name = '{LISTENER_PREFIX}' || l.instance))"
)
# The rows of server processes that have ended (or of a pid since given to another).
FORGET_ENDED = (
    "delete from listeners l where not exists"  # noqa: S608 - constants
    f" (select 1 from pg_stat_activity a where {_LIVE})"
)
UNREGISTER = "delete from listeners where instance = $1"
# The other instances listening now.
LISTENING = (
    f"select l.instance from listeners l join pg_stat_activity a on {_LIVE}"  # noqa: S608 - constants
    " where a.datname = current_database() and l.instance <> $1"
)


def _mac(key: bytes, text: str) -> str:
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


def acknowledgement(key: bytes, instance: str, generation: str) -> str:
    """The keysvc_seen payload saying ``instance`` has heard ``generation``."""
    text = f"{instance}:{generation}"
    return f"{text}:{_mac(key, text)}"


def acknowledged(key: bytes, payload: str) -> tuple[str, int] | None:
    """The instance and generation a keysvc_seen payload acknowledges, or None when
    keysvc did not sign it with ``key``."""
    text, _, mac = payload.rpartition(":")
    if not hmac.compare_digest(mac.encode(errors="replace"), _mac(key, text).encode()):
        return None
    instance, _, generation = text.rpartition(":")
    try:
        return instance, int(generation)
    except ValueError:
        return None
