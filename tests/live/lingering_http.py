"""An HTTP server that behaves as SGLang's does when its port is taken: uvicorn logs the bind error
and gives up, but the process lives on (SGLang's scheduler children keep it alive).

    python -m tests.live.lingering_http PORT
"""

from __future__ import annotations

import sys
import time

import uvicorn


async def app(scope, receive, send) -> None:  # noqa: ANN001 (an ASGI app)
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


if __name__ == "__main__":
    try:
        uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="info")
    except SystemExit:
        pass
    time.sleep(3600)
