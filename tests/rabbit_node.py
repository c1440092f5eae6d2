"""A private RabbitMQ node for tests that inject broker faults.

The node runs from the installed server scripts with everything of its own under one directory:
its name, AMQP and distribution ports (free ones picked at run time), its own epmd on its own
port, mnesia, logs, config (127.0.0.1 only, guest allowed over loopback) and Erlang cookie. The
shared broker (127.0.0.1:5672) and the shared epmd are never contacted. Processes run as
whatever user runs the tests (root is fine).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.support import unavailable

# The server scripts themselves: the Debian wrappers in /usr/sbin switch to the rabbitmq user
# and its HOME (another cookie, the shared node's logs).
SCRIPT_DIRS = (Path("/usr/lib/rabbitmq/bin"),)
START_WITHIN_S = 90.0
STOP_WITHIN_S = 30.0
AMQP_HEADER = b"AMQP\x00\x00\x09\x01"
# Inherited settings that would point the node (or the CLI) elsewhere.
DROPPED_ENV = ("RABBITMQ_", "ERL_")


def _scripts() -> Path | None:
    found = shutil.which("rabbitmq-server")
    candidates = [*SCRIPT_DIRS, *([Path(found).parent] if found else [])]
    for directory in candidates:
        if (directory / "rabbitmq-server").is_file() and (directory / "rabbitmqctl").is_file():
            return directory
    return None


def _free_ports(count: int) -> list[int]:
    """Ports free on 127.0.0.1 right now (held together so they are distinct)."""
    socks = [socket.socket() for _ in range(count)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def _die_with_parent(sig: int) -> None:
    """In the child before exec: receive ``sig`` when the test process dies (even kill -9 or
    os._exit), so a node never outlives its run. Linux only; elsewhere the fixture's
    teardown is the only guard."""
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, sig)


def _answers_amqp(port: int) -> bool:
    """True once the broker sends Connection.Start (a method frame) for a protocol header."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
            sock.sendall(AMQP_HEADER)
            return sock.recv(1) == b"\x01"
    except OSError:
        return False


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


@dataclass
class RabbitNode:
    """One running node; ``stop()`` ends it and everything it started."""

    name: str
    port: int
    base: Path
    scripts: Path
    env: dict[str, str]
    server: subprocess.Popen[bytes]
    epmd: subprocess.Popen[bytes]
    stopped: bool = field(default=False)

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/"

    def ctl(self, *args: str, timeout: float = 60) -> str:
        """``rabbitmqctl -n NODE args...``; fails the test with its stderr on a non-zero exit."""
        done = subprocess.run(
            [str(self.scripts / "rabbitmqctl"), "-n", self.name, *args],
            env=self.env,
            cwd=self.base,
            capture_output=True,
            timeout=timeout,
            check=False,
        )
        if done.returncode != 0:
            raise AssertionError(f"rabbitmqctl {args[0]} failed: {done.stderr.decode()[-800:]}")
        return done.stdout.decode().strip()

    def eval(self, expression: str) -> str:
        """Evaluate an Erlang expression on the node (rabbitmqctl eval); blocking."""
        return self.ctl("eval", expression)

    def log_tail(self, chars: int = 3000) -> str:
        logs = [self.base / "server.out", *sorted((self.base / "log").glob("*.log"))]
        return "\n".join(p.read_text(errors="replace")[-chars:] for p in logs if p.is_file())

    def stop(self) -> None:
        """Stop the node (rabbitmqctl stop), kill -9 its process group if it lingers, then its
        epmd. Idempotent; never raises for a node that is already gone."""
        if self.stopped:
            return
        self.stopped = True
        try:
            if self.server.poll() is None:
                with contextlib.suppress(AssertionError, subprocess.TimeoutExpired, OSError):
                    self.ctl("stop", timeout=STOP_WITHIN_S)
                _wait_unreaped(self.server.pid, STOP_WITHIN_S)
                # The leader is a zombie or still running, so its group id is still ours.
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.server.pid, signal.SIGKILL)
            self.server.wait()
        finally:
            if self.epmd.poll() is None:
                self.epmd.kill()
            self.epmd.wait()


def _wait_unreaped(pid: int, within: float) -> None:
    """Wait up to ``within`` s for ``pid`` to exit without reaping it."""
    deadline = time.monotonic() + within
    flags = os.WEXITED | os.WNOHANG | os.WNOWAIT
    while time.monotonic() < deadline:
        if os.waitid(os.P_PID, pid, flags) is not None:
            return
        time.sleep(0.1)


def _prepare(base: Path, port: int) -> None:
    for sub in ("home", "mnesia", "log"):
        (base / sub).mkdir(parents=True, exist_ok=True)
    cookie = base / "home" / ".erlang.cookie"
    cookie.write_text(secrets.token_hex(20))
    cookie.chmod(0o400)
    (base / "rabbitmq.conf").write_text(
        f"listeners.tcp.1 = 127.0.0.1:{port}\nloopback_users = none\n"
    )
    (base / "rabbitmq-env.conf").write_text("")  # the system one sets NODENAME
    (base / "enabled_plugins").write_text("[].\n")


def _environment(base: Path, name: str, port: int, dist: int, epmd: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(DROPPED_ENV)}
    env.update(
        HOME=str(base / "home"),
        RABBITMQ_NODENAME=name,
        RABBITMQ_NODE_PORT=str(port),
        RABBITMQ_DIST_PORT=str(dist),
        RABBITMQ_MNESIA_BASE=str(base / "mnesia"),
        RABBITMQ_LOG_BASE=str(base / "log"),
        RABBITMQ_PID_FILE=str(base / "rabbit.pid"),
        RABBITMQ_ENABLED_PLUGINS_FILE=str(base / "enabled_plugins"),
        RABBITMQ_CONFIG_FILE=str(base / "rabbitmq.conf"),
        RABBITMQ_CONF_ENV_FILE=str(base / "rabbitmq-env.conf"),
        # One node beside the shared broker: the default schedulers (one per core). A cluster
        # of three on two cores would want +S 1:1 each (../shared/CLUSTER.md).
        RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}",
        ERL_EPMD_ADDRESS="127.0.0.1",
        ERL_EPMD_PORT=str(epmd),
        ERL_CRASH_DUMP=str(base / "erl_crash.dump"),
    )
    return env


def start_node(tmp_dir: Path, name: str = "accord") -> RabbitNode:
    """Start a private node under ``tmp_dir`` and return once it answers AMQP (~10 s). Skips
    (fails under CI) when the RabbitMQ server is not installed. The caller must ``stop()``
    it; start it from a thread that lives as long as the node (the test's main thread), as
    the node is told to stop when that thread ends."""
    scripts, epmd_exe = _scripts(), shutil.which("epmd") or "/usr/lib/erlang/bin/epmd"
    if scripts is None or not Path(epmd_exe).is_file():
        unavailable("rabbitmq-server (or epmd) not installed: cannot start a private node")
        raise AssertionError("unreachable")
    base = Path(tmp_dir)
    port, dist, epmd_port = _free_ports(3)
    node_name = f"{name}{secrets.token_hex(4)}@localhost"
    _prepare(base, port)
    env = _environment(base, node_name, port, dist, epmd_port)
    epmd = subprocess.Popen(
        [epmd_exe, "-port", str(epmd_port), "-address", "127.0.0.1"],
        env=env,
        cwd=base,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=lambda: _die_with_parent(signal.SIGKILL),
    )
    _until(lambda: _port_open(epmd_port) or epmd.poll() is not None, 10)
    with (base / "server.out").open("wb") as out:
        # The script traps SIGTERM and stops the node it started.
        server = subprocess.Popen(
            [str(scripts / "rabbitmq-server")],
            env=env,
            cwd=base,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=lambda: _die_with_parent(signal.SIGTERM),
        )
    node = RabbitNode(node_name, port, base, scripts, env, server, epmd)
    try:
        _until(lambda: _answers_amqp(port) or server.poll() is not None, START_WITHIN_S)
        if server.poll() is not None or not _answers_amqp(port):
            raise RuntimeError(f"RabbitMQ node {node_name} did not start:\n{node.log_tail()}")
    except BaseException:
        node.stop()
        raise
    return node


def _until(done: Callable[[], bool], within: float) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline and not done():
        time.sleep(0.1)
