"""The route of imports (issue 37), declared as ``keysvc.http.routes`` declares the
others; ``routes.ROUTES`` lists it in the document's order. The export is the CLI's
alone (``keysvc export``): a million keys are read by the operator, never answered."""

from keysvc.domain.imports import MAX_IMPORT_RECORDS
from keysvc.http import import_schemas as im
from keysvc.http.routing import ORG, WRITE, Route

IMPORT_PATH = ORG + "/keys/import"

_IMPORT = (
    "Needs the permission `keys:create`. keysvc addition. Up to "
    f"{MAX_IMPORT_RECORDS} records (ImportRecord: a create's fields, your `importId`, and "
    "the key's material as `hashData`, as `tokenHash` (the SHA-256 of a bearer token, "
    "which then authenticates as `Authorization: Bearer <token>`), or neither (the key "
    "opens with nothing until it is rotated: an exported record)), in one transaction. "
    "Each record is checked as a create is; a refused one is listed in `errors` by its "
    "index, with the reason, and the others go in. A record whose importId this "
    "organization imported before is skipped and counted in `skipped`: importing the same "
    "records again makes nothing twice. The organization's key limit counts each record. "
    "One `key_import` activity records the batch; no key.created event is sent. The body "
    "may be up to 8 MiB."
)
IMPORT_KEYS = Route(
    "POST",
    IMPORT_PATH,
    "keysvcKeyImport",
    "Import keys by hash (keysvc addition)",
    permission="keys:create",
    body=im.ImportKeysSchema,
    response=im.ImportResultSchema,
    answer="What was imported, skipped and refused.",
    statuses=(*WRITE, 413),
    description=_IMPORT,
)
