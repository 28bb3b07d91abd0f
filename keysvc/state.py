"""Typed keys for what the application and each request carry."""

from aiohttp import web

from keysvc.config import Settings
from keysvc.credentials import Hasher
from keysvc.store import Key, Store
from keysvc.timeutil import Clock

SETTINGS = web.AppKey("settings", Settings)
STORE = web.AppKey("store", Store)
HASHER = web.AppKey("hasher", Hasher)
CLOCK: web.AppKey[Clock] = web.AppKey("clock")

REQUEST_ID = web.RequestKey("request_id", str)
CALLER = web.RequestKey("caller", Key)
