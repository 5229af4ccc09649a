"""A tiny MCP server over stdio (newline-delimited JSON-RPC 2.0), for tests that configure a
client (Codex CLI) with an MCP server of their own: one tool, `lookup_code_word`, which returns a
fixed secret word and appends each call's arguments to the file named by $MCP_CALL_LOG."""

from __future__ import annotations

import json
import os
import sys

SECRET = "PERIWINKLE-42"
TOOL = {
    "name": "lookup_code_word",
    "description": "Returns the project's secret code word. Call it whenever the user asks for the code word.",
    "inputSchema": {"type": "object", "properties": {"topic": {"type": "string", "description": "what it is for"}},
                    "required": []},
}


def reply(msg_id, result=None, error=None) -> None:
    out = {"jsonrpc": "2.0", "id": msg_id}
    if error is not None:
        out["error"] = error
    else:
        out["result"] = result
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()


def main() -> None:
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        msg = json.loads(line)
        method, msg_id = msg.get("method"), msg.get("id")
        if msg_id is None:  # a notification (notifications/initialized, cancelled, ...)
            continue
        if method == "initialize":
            version = msg.get("params", {}).get("protocolVersion", "2025-06-18")
            reply(msg_id, {"protocolVersion": version, "capabilities": {"tools": {"listChanged": False}},
                           "serverInfo": {"name": "etserve-test-mcp", "version": "1.0.0"}})
        elif method == "tools/list":
            reply(msg_id, {"tools": [TOOL]})
        elif method == "tools/call":
            params = msg.get("params", {})
            log = os.environ.get("MCP_CALL_LOG")
            if log:
                with open(log, "a", encoding="utf-8") as f:
                    f.write(json.dumps(params) + "\n")
            reply(msg_id, {"content": [{"type": "text", "text": f"The code word is {SECRET}."}], "isError": False})
        elif method == "ping":
            reply(msg_id, {})
        else:
            reply(msg_id, error={"code": -32601, "message": f"method not found: {method}"})


if __name__ == "__main__":
    main()
