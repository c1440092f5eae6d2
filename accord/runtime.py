"""Process plumbing for long-running commands: the event loop and exit codes."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio


def run(main: Callable[..., Awaitable[Any]], *args: Any) -> Any:
    """Run ``main`` on asyncio, with uvloop as the loop where it is installed."""
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return anyio.run(main, *args)
    return anyio.run(main, *args, backend_options={"use_uvloop": True})
