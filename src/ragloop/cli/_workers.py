"""``ragloop serve --workers N``: N worker processes serving one listening socket, and their supervisor.

The supervisor binds the address once and starts N workers (``python -m ragloop.cli._serve``), each given the
socket's file descriptor and the command's options (JSON in ``RAGLOOP_SERVE_WORKER``; :func:`worker_args`). Each worker
is a whole ``ragloop serve``: its own index or store pool, session store, turn log and turn slots; the kernel
spreads new connections over them. On SIGINT or SIGTERM the supervisor sends SIGTERM to every worker, each stops as
a single server does (new turns 503, turns in flight cancelled with an error frame) and the supervisor exits 0
when they all have. A worker that dies while the others serve (killed, out of memory) is started again, unless it
dies within ``_EARLY_S`` of starting ``_EARLY_LIMIT`` times in a row: then the supervisor stops them all (exit 1).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any

__all__ = ["serve_workers", "worker_args"]

_ENV = "RAGLOOP_SERVE_WORKER"
#: A worker that exits this soon after it started has a problem a restart will not fix (a bad option, a port).
_EARLY_S = 10.0
_EARLY_LIMIT = 3


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket listening on ``host:port`` (IPv6 when ``host`` is an IPv6 address), inheritable."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host.strip("[]"), port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _options(args: argparse.Namespace) -> str:
    """The command's options as JSON (everything but the function argparse attached)."""
    return json.dumps({k: v for k, v in vars(args).items() if k != "func"})


class _Pool:
    """The worker processes: started, watched, restarted, stopped."""

    def __init__(self, args: argparse.Namespace, sock: socket.socket) -> None:
        self.args = args
        self.sock = sock
        self.procs: list[subprocess.Popen[bytes] | None] = [None] * args.workers
        self.started: list[float] = [0.0] * args.workers
        self.early = 0
        self.stopping = False

    def start(self, i: int) -> None:
        env = {**os.environ, _ENV: _options(self.args), "RAGLOOP_SERVE_FD": str(self.sock.fileno())}
        cmd = [sys.executable, "-m", "ragloop.cli._serve", str(i)]
        self.procs[i] = subprocess.Popen(cmd, env=env, pass_fds=(self.sock.fileno(),))
        self.started[i] = time.monotonic()

    def watch(self) -> int:
        """Restart workers that die until a signal stops the pool; the exit code."""
        while not self.stopping:
            for i, proc in enumerate(self.procs):
                if proc is None or proc.poll() is None:
                    continue
                if proc.returncode == 0:  # it was told to stop (Ctrl-C reaches the whole process group): stop all
                    self.stopping = True
                    break
                early = time.monotonic() - self.started[i] < _EARLY_S
                self.early = self.early + 1 if early else 0
                if self.early >= _EARLY_LIMIT:
                    print(
                        f"ragloop: worker {i} exited {proc.returncode} within {_EARLY_S:.0f} s of starting, "
                        f"{_EARLY_LIMIT} times in a row; stopping every worker",
                        file=sys.stderr,
                    )
                    self.stop()
                    return 1
                print(f"ragloop: worker {i} exited {proc.returncode}; starting it again", file=sys.stderr)
                self.start(i)
            time.sleep(0.2)
        return 0

    def stop(self) -> None:
        """SIGTERM every worker and wait for each (SIGKILL after a minute)."""
        self.stopping = True
        for proc in self.procs:
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            if proc is None:
                continue
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def serve_workers(args: argparse.Namespace) -> int:
    """Bind ``args.host:args.port`` and run ``args.workers`` workers on it until SIGINT or SIGTERM."""
    sock = listening_socket(args.host, args.port)
    pool = _Pool(args, sock)

    def on_signal(signum: int, frame: Any) -> None:
        pool.stopping = True

    originals = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        for i in range(args.workers):
            pool.start(i)
        print(
            f"ragloop: {args.workers} workers on http://{args.host}:{sock.getsockname()[1]}/ (each its own pools)",
            file=sys.stderr,
        )
        code = pool.watch()
        if code == 0:
            pool.stop()
        return code
    finally:
        for sig, handler in originals.items():
            signal.signal(sig, handler)
        sock.close()


def worker_args() -> argparse.Namespace:
    """In a worker: the supervisor's options, with ``workers`` 1 and ``fd`` the inherited socket."""
    args = argparse.Namespace(**json.loads(os.environ.pop(_ENV)))
    args.workers, args.fd = 1, int(os.environ.pop("RAGLOOP_SERVE_FD"))
    return args
