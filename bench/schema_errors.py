"""How big the answer to a TOOL_CALL with badly wrong params is, and how long validating
it takes: 500 array items of 1,000 characters each where integers are expected.

    python bench/schema_errors.py

The answer is bounded (docs/PROTOCOL.md): at most 5 schema errors in `detail`, each
message at most 200 characters, and the validator stops after the sixth error."""

from __future__ import annotations

import json
import time

from protoflask.core.errors import ProtoError
from protoflask.tools import Tool, check_call

SCHEMA = {"type": "object", "required": ["items"],
          "properties": {"items": {"type": "array", "items": {"type": "integer"}}}}


def main() -> None:
    tool = Tool("count", "Counts items.", SCHEMA, {}, lambda params, *_: {})
    params = {"items": ["x" * 1000] * 500}
    best = float("inf")
    payload: dict = {}
    for _ in range(20):
        started = time.perf_counter()
        try:
            check_call(tool, "count", params)
        except ProtoError as exc:
            best = min(best, time.perf_counter() - started)
            payload = exc.to_payload()
    print(f"schema errors in detail: {len(payload['detail'])}")
    print(f"ERROR payload: {len(json.dumps(payload))} bytes")
    print(f"validation (best of 20): {best * 1000:.2f} ms")
    print(f"message: {payload['message'][:100]}...")


if __name__ == "__main__":
    main()
