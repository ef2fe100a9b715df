"""One request through an ASGI middleware, in the test's own process."""

import asyncio

from servetune.engine.serverside.servetune_access import RequireSecret


def call(scope_type: str, path: str, authorization: str | None = None, app_class=RequireSecret, **kw):
    """Run one request through the middleware in front of an app that answers 200: (the app was reached, the
    messages sent back)."""
    reached, sent = [], []

    async def app(scope, receive, send):
        reached.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": []})

    async def receive():
        return {"type": "http.request"}

    async def send(message):
        sent.append(message)

    headers = [(b"authorization", authorization.encode())] if authorization else []
    scope = {"type": scope_type, "path": path, "root_path": "", "method": "POST", "headers": headers}
    asyncio.run(app_class(app, **kw)(scope, receive, send))
    return bool(reached), sent
