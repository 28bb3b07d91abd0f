"""The bounds and names the domain's rules are stated in: how many roles a key holds,
how many webhooks an organization keeps, how long a usage query may be, the fields a
key may not change about itself. The request schemas (``keysvc.http.schemas``,
``keysvc.http.queries``) validate against the same values, imported from here.
"""

from keysvc.nesting import MAX_BODY_DEPTH as MAX_BODY_DEPTH
from keysvc.nesting import MAX_META_DEPTH as MAX_META_DEPTH

# Roles a key holds at most, those named in its legacy ``roles`` included.
MAX_ROLE_IDS = 100
# How an actor names a key in a role's ``actors``: this prefix, then the key's UUID.
ACTOR_PREFIX = "apiKey/"
# The fields a PATCH of a key may send, in the schema's order
# (tests/unit/test_limits.py holds the two together).
KEY_FIELDS = (
    "name", "expireAt", "state", "roles", "assignedRoleIds", "ipAccessList", "rateLimit",
    "externalId", "meta", "credits", "ratelimits",
)  # fmt: skip
# What a key may not change about itself: every field but its name. Otherwise a key
# could lift the IP access list, expiry or rate limit it was given, or re-role itself.
OWN_ACCESS = tuple(field for field in KEY_FIELDS if field != "name")
# Webhooks: the longest URL, how many an organization keeps, and how many days before
# a key's expireAt ``key.expiring`` is sent when the subscription does not say.
MAX_WEBHOOK_URL = 2048
MAX_WEBHOOKS_PER_ORG = 20
DEFAULT_EXPIRING_DAYS = 7
# How long a webhook's previous secret signs beside the new one after a rotation.
DEFAULT_SECRET_OVERLAP = 24 * 3600
MAX_SECRET_OVERLAP = 7 * 24 * 3600
# The most buckets one usage query may ask for: a day of minutes.
MAX_USAGE_BUCKETS = 1440
# Leaked secrets (keysvc.domain.leaks): the longest secret a report may name (a
# hashData client's own secrets may be long), and the most tokens one GitHub
# secret-scanning report may carry.
MAX_LEAKED_SECRET = 4096
MAX_SCANNING_TOKENS = 100
