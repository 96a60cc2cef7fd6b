"""The OpenAPI description of POST /webhook: every header and parameter the crawler may send.

The endpoint reads them itself (cheaper than FastAPI's per-parameter validation), so they are
declared here for the schema only: clients, docs and the schemathesis fuzz test see them all.
"""

from __future__ import annotations

_STATUS = {"type": "string", "pattern": "^[1-9][0-9]{2}(, ?[1-9][0-9]{2})*$",
           "description": "an HTTP status; repeated values may be comma-joined (`200, 200`)",
           "examples": ["200", "404", "200, 200"]}
_URL = {"type": "string", "pattern": "^https?://[a-z0-9-]+(\\.[a-z0-9-]+)*(/[A-Za-z0-9._~/-]*)?$", "maxLength": 2048,
        "examples": ["https://example.com/page"]}


def _header(name: str, schema: dict, description: str) -> dict:
    return {"name": name, "in": "header", "required": False, "schema": schema, "description": description}


WEBHOOK_OPENAPI: dict = {
    "parameters": [
        {"name": "token", "in": "query", "required": False, "schema": {"type": "string"},
         "description": "the webhook token (WEBHOOK_TOKEN), for crawlers that can only put it in the "
                        "callback URL; X-Webhook-Token is preferred and wins when both are given"},
        _header("X-Webhook-Token", {"type": "string"},
                "the webhook token (preferred: a URL ends up in proxies' logs); wins over the query parameter"),
        _header("rid", {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,256}$"},
                "the crawler's request id; unique per delivery"),
        _header("url", _URL, "the delivered (final) http(s) URL"),
        _header("Pushed-Url", _URL,
                "the URL that was pushed (sent back through callback_headers)"),
        _header("CB-Status", _STATUS, "crawler status (preferred over PC-Status)"),
        _header("cb_status", _STATUS, "crawler status, underscore spelling"),
        _header("PC-Status", _STATUS, "crawler status, older spelling"),
        _header("pc_status", _STATUS, "crawler status, older underscore spelling"),
        _header("Original-Status", _STATUS, "the site's status"),
        _header("original_status", _STATUS, "the site's status, underscore spelling"),
        _header("Content-Encoding", {"type": "string", "enum": ["gzip", "identity"]},
                "gzip bodies are also recognised by their magic bytes"),
        _header("User-Agent", {"type": "string"},
                "`Crawlbase Monitoring Bot 1.0` marks the monitoring probe: answered 200, stored nothing"),
    ],
    "requestBody": {
        "required": False,
        "content": {
            "application/octet-stream": {"schema": {"type": "string", "format": "binary"},
                                         "description": "the page, gzip'd or not"},
            "text/markdown": {"schema": {"type": "string"}},
            "text/plain": {"schema": {"type": "string"}},
            "gzip/json": {"schema": {
                "type": "object",
                "properties": {"rid": {"type": "string"}, "url": {"type": "string"},
                               "pc_status": {"type": ["integer", "string"]},
                               "original_status": {"type": ["integer", "string"]},
                               "body": {"type": "string"}},
            }},
        },
    },
    "responses": {
        "200": {"description": "stored, duplicate (rid already stored) or ignored (monitoring probe)"},
        "400": {"description": "a bad delivery; `reason` says why; nothing stored"},
        "401": {"description": "missing or wrong token; the body is not read"},
        "413": {"description": "body or decompressed page over its cap"},
        "503": {"description": "database unavailable; retry"},
    },
}
