"""Activity views: the organization's activity log, read only."""

from aiohttp import web

from keysvc.domain import activities
from keysvc.errors import NotFound
from keysvc.http.envelope import ok
from keysvc.http.queries import ListActivitiesQuerySchema
from keysvc.http.responses import ActivitySchema
from keysvc.http.routes import GET_ACTIVITY, LIST_ACTIVITIES, serves
from keysvc.http.schemas import load
from keysvc.http.state import HASHER, SETTINGS, STORE
from keysvc.http.views.common import authorized, path_uuid, query

NOT_FOUND = "activity not found in this organization"

_activity = ActivitySchema()
_activities = ActivitySchema(many=True)
_list_query = ListActivitiesQuerySchema()


@serves(LIST_ACTIVITIES)
async def list_activities(request: web.Request) -> web.Response:
    _, organization_id = authorized(request)
    params, hasher = load(_list_query, query(request)), request.app[HASHER]
    activities.check_range(params)
    after = activities.decode_cursor(hasher, organization_id, params.get("cursor"))
    page = await request.app[STORE].list_activities(
        organization_id, after, params["limit"], params.get("from_date"), params.get("to_date"),
        activities.listed_kinds(params), request.app[SETTINGS].activity_page_bytes,
    )  # fmt: skip
    return ok(
        request,
        _activities.dump(page.activities),
        nextCursor=activities.next_cursor(hasher, organization_id, page),
        totalCount=page.total,
    )


@serves(GET_ACTIVITY)
async def get_activity(request: web.Request) -> web.Response:
    _, organization_id = authorized(request)
    activity_id = path_uuid(request, "activityId")
    found = await request.app[STORE].get_activity(organization_id, activity_id)
    if found is None:
        raise NotFound(NOT_FOUND)
    return ok(request, _activity.dump(found))
