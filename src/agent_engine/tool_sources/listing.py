"""A sync's listing in a child process of its own, with its own memory and time bounds.

Listing a server means reading and parsing what it chose to send. Even capped by bytes read
(`client.MAX_LISTING_BYTES`), parsing megabytes of tool definitions costs CPU and memory, and the
api (`syncToolSource`) and the worker (the periodic re-sync, on the loop that runs owners' runs)
should pay neither. So the listing runs in `python -m agent_engine.tool_sources.listing`:

- the request (URL, credential, seconds) goes in on stdin as JSON -- never argv, which other
  users of the machine can read;
- the child limits its own address space (`LISTING_MEMORY_BYTES`) and lowers its CPU priority
  (`LISTING_NICENESS`) before it connects;
- the parent kills it when it has not answered within the sync's seconds plus
  `LISTING_STARTUP_SECONDS`, and reads at most `MAX_LISTING_OUTPUT_BYTES` of its answer (the tools
  as JSON) -- the parent's cost is one bounded JSON document, however the server behaved.

Errors are `McpError`, as from `client.list_tools`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import resource
import sys
from typing import Any

from agent_engine.domain.mcp import ToolAccess
from agent_engine.tool_sources.client import (
    MAX_LISTING_BYTES,
    McpError,
    RemoteTool,
    list_tools,
)

log = logging.getLogger(__name__)

MODULE = "agent_engine.tool_sources.listing"
# The child's address space: the interpreter and the SDK take ~70 MiB, a capped listing parsed
# a few times its size.
LISTING_MEMORY_BYTES = 512 * 2**20
# Beyond the sync's own seconds: the interpreter starting and importing the SDK (~1 s of CPU).
LISTING_STARTUP_SECONDS = 15.0
# The child's answer: the tools re-serialised (escapes may grow a listing's text, never 4-fold).
MAX_LISTING_OUTPUT_BYTES = 4 * MAX_LISTING_BYTES
# The child's scheduling priority below its parent's (starting it and parsing a listing cost about
# a second of CPU, which on a small machine the runs' steps would otherwise wait for).
LISTING_NICENESS = 10
MAX_REQUEST_BYTES = 64_000
MAX_STDERR_BYTES = 16_000
READ_CHUNK_BYTES = 64 * 1024


async def list_tools_isolated(url: str, token: str | None, *, seconds: float) -> list[RemoteTool]:
    """`client.list_tools` in a child process: every tool the server lists, or McpError."""
    request = json.dumps({"url": url, "token": token, "seconds": seconds}).encode()
    try:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            MODULE,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
    except OSError as exc:
        raise McpError(f"the listing could not start ({type(exc).__name__})") from exc
    try:
        async with asyncio.timeout(seconds + LISTING_STARTUP_SECONDS):
            assert process.stdin is not None and process.stdout is not None
            assert process.stderr is not None
            process.stdin.write(request)
            await process.stdin.drain()
            process.stdin.close()
            output, errors = await asyncio.gather(
                _read_capped(process.stdout, MAX_LISTING_OUTPUT_BYTES),
                _read_capped(process.stderr, MAX_STDERR_BYTES, keep_tail=True),
            )
            code = await process.wait()
    except TimeoutError:
        raise McpError("no answer in time") from None
    except _OutputTooLarge:
        raise McpError(
            f"the listing is larger than {MAX_LISTING_OUTPUT_BYTES} bytes once read"
        ) from None
    finally:
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
    if errors.strip():
        log.info("the listing of %s said: %s", _host(url), errors.decode(errors="replace")[-2000:])
    try:
        answer = json.loads(output)
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        raise McpError(
            f"the listing stopped (exit code {code}; it may have needed more than "
            f"{LISTING_MEMORY_BYTES // 2**20} MiB)"
        )
    if "error" in answer:
        raise McpError(str(answer["error"]))
    return [_tool_of(item) for item in answer["tools"]]


class _OutputTooLarge(Exception):
    pass


async def _read_capped(
    stream: asyncio.StreamReader, limit_bytes: int, *, keep_tail: bool = False
) -> bytes:
    """Everything `stream` sends; past `limit_bytes`, _OutputTooLarge (or, `keep_tail`, only the
    last `limit_bytes`, read to the end)."""
    data = bytearray()
    while chunk := await stream.read(READ_CHUNK_BYTES):
        data += chunk
        if len(data) > limit_bytes:
            if not keep_tail:
                raise _OutputTooLarge
            del data[:-limit_bytes]
    return bytes(data)


def _host(url: str) -> str:
    return url.split("//", 1)[-1].split("/", 1)[0]


def _tool_of(item: dict[str, Any]) -> RemoteTool:
    return RemoteTool(
        name=item["name"],
        description=item["description"],
        input_schema=item["input_schema"],
        access=ToolAccess(item["access"]),
    )


def _child() -> int:
    """The child's side: a request on stdin, the tools (or an error) on stdout."""
    resource.setrlimit(resource.RLIMIT_AS, (LISTING_MEMORY_BYTES, LISTING_MEMORY_BYTES))
    # Behind the runs on the CPU: a sync may wait, an owner's step should not.
    os.nice(LISTING_NICENESS)
    request = json.loads(sys.stdin.buffer.read(MAX_REQUEST_BYTES))
    answer: dict[str, Any]
    try:
        tools = asyncio.run(
            list_tools(request["url"], request["token"], seconds=float(request["seconds"]))
        )
        answer = {
            "tools": [
                {
                    "name": tool.name,
                    "description": tool.description,
                    "input_schema": tool.input_schema,
                    "access": str(tool.access),
                }
                for tool in tools
            ]
        }
    except McpError as exc:
        answer = {"error": str(exc)}
    except MemoryError:
        answer = {"error": f"the listing needs more than {LISTING_MEMORY_BYTES // 2**20} MiB"}
    sys.stdout.write(json.dumps(answer))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    sys.exit(_child())
