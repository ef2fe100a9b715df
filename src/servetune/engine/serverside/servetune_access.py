"""Only servetune may use the servers it launches. Loaded by vLLM (`--middleware servetune_access.RequireSecret`, with
this directory on PYTHONPATH): every HTTP and websocket request must carry the server's secret, from the environment
variable SERVETUNE_SERVER_SECRET, as a bearer token or as the password of basic authentication (a URL's
`user:secret@`). Any other is refused (401) before vLLM sees it: the development routes that VLLM_SERVER_DEV_MODE=1
opens (/reset_prefix_cache, /collective_rpc, /sleep, ...) as well as the API, where vLLM's own --api-key guards only
/v1 and a few other prefixes. Standalone: it imports nothing of servetune."""

import base64
import binascii
import hmac
import os

SECRET_ENV = "SERVETUNE_SERVER_SECRET"
_REFUSED = b'{"error": "Unauthorized"}'


class RequireSecret:
    """A pure ASGI middleware: a request goes on to vLLM only with the secret. A server started without one does
    not start (KeyError)."""

    def __init__(self, app):
        self.app = app
        self.secret = os.environ[SECRET_ENV].encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket") or self._allowed(scope):
            await self.app(scope, receive, send)
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
        else:
            await send({"type": "http.response.start", "status": 401, "headers": [
                (b"content-type", b"application/json"), (b"content-length", str(len(_REFUSED)).encode()),
                (b"www-authenticate", b"Bearer")]})
            await send({"type": "http.response.body", "body": _REFUSED})

    def _allowed(self, scope) -> bool:
        """Whether the request's Authorization header holds the secret (bearer token, or basic password)."""
        header = dict(scope.get("headers") or ()).get(b"authorization", b"")
        scheme, _, value = header.partition(b" ")
        if scheme.lower() == b"bearer":
            given = value.strip()
        elif scheme.lower() == b"basic":
            try:
                given = base64.b64decode(value.strip(), validate=True).partition(b":")[2]
            except (binascii.Error, ValueError):
                return False
        else:
            return False
        return hmac.compare_digest(given, self.secret)
