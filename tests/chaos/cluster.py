"""A private 3-node RabbitMQ cluster for the cluster scenarios, beside the machine's own broker.

Each node (``ntf1@localhost`` …) runs from the installed RabbitMQ with everything of its own in
one temporary directory: a config file with its own AMQP listener, its own distribution port,
data, logs and PID file, an empty plugin list, and an Erlang cookie in a ``HOME`` of its own (so
neither the node nor the ``rabbitmqctl`` calls that address it can reach the machine's node,
whose cookie they do not have). The machine's node on 5672 is never addressed: every command
here names one of our nodes with ``-n``.

The nodes start in parallel; the second and third join the first (``stop_app`` /
``join_cluster`` / ``start_app``). ``stop`` ends each node with ``rabbitmqctl -n <node> stop``,
then by its PID if it is still there, and removes the directory.
"""

from __future__ import annotations

import os
import re
import select
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

from tests.chaos.harness import free_port

RABBITMQ_BIN = Path("/usr/lib/rabbitmq/bin")
# in ``list_connections pid client_properties``: <ntf1_ab12cd@localhost.1796433476.1601.0>
_CONNECTION_PID = re.compile(r"<([^<>@\s]+@[^.\s]+)\.")
_CONNECTION_NAME = re.compile(r'\{"connection_name","notifier ([^"]+)"\}')
NODES = 3
BOOT_TIMEOUT_SECONDS = 120


@dataclass
class Node:
    name: str  # the short name: ntf1
    port: int  # AMQP
    dist_port: int  # Erlang distribution
    root: Path  # the cluster's directory
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)  # the script
    vm_pid: int = 0  # its Erlang VM, as the node reports it once booted

    @property
    def nodename(self) -> str:
        return f"{self.name}@localhost"

    def url(self, vhost: str) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/{vhost}"

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


class Cluster:
    """The nodes and the commands that address them. Create with ``open_cluster``."""

    def __init__(self, root: Path, count: int = NODES) -> None:
        self.root = root
        tag = uuid.uuid4().hex[:6]
        self.nodes = [
            Node(f"ntf{i}_{tag}", free_port(), free_port(), root) for i in range(1, count + 1)
        ]
        self.home = root / "home"
        self.home.mkdir()
        cookie = self.home / ".erlang.cookie"
        cookie.write_text(uuid.uuid4().hex.upper())
        cookie.chmod(0o400)
        (root / "enabled_plugins").write_text("[].\n")
        (root / "rabbitmq-env.conf").write_text("")  # not the machine's /etc/rabbitmq one
        for node in self.nodes:
            (root / f"{node.name}.conf").write_text(
                f"listeners.tcp.1 = 127.0.0.1:{node.port}\n"
                "log.console = false\n"
                "log.file.level = info\n"
                # a lost node is simply gone until it is back: no automatic partition healing
                "cluster_partition_handling = ignore\n"
            )

    def urls(self, vhost: str) -> list[str]:
        return [node.url(vhost) for node in self.nodes]

    def node(self, nodename: str) -> Node:
        return next(n for n in self.nodes if n.nodename == nodename)

    def _env(self, node: Node | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RABBITMQ_", "ERL_"))}
        env.update(
            HOME=str(self.home),
            RABBITMQ_CONF_ENV_FILE=str(self.root / "rabbitmq-env.conf"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(self.root / "enabled_plugins"),
            RABBITMQ_MNESIA_BASE=str(self.root / "mnesia"),
            RABBITMQ_LOG_BASE=str(self.root / "log"),
            ERL_EPMD_ADDRESS="127.0.0.1",
        )
        if node is not None:
            env.update(
                RABBITMQ_NODENAME=node.nodename,
                RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
                RABBITMQ_NODE_PORT=str(node.port),
                RABBITMQ_DIST_PORT=str(node.dist_port),
                RABBITMQ_CONFIG_FILE=str(self.root / f"{node.name}.conf"),
                RABBITMQ_PID_FILE=str(self.root / f"{node.name}.pid"),
                RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}",
            )
        return env

    def ctl(self, node: Node, *args: str, tool: str = "rabbitmqctl", timeout: float = 60) -> str:
        """``<tool> -n <node> <args>`` (``rabbitmqctl``, ``rabbitmq-queues`` …), on our node."""
        done = subprocess.run(
            [str(RABBITMQ_BIN / tool), "-q", "-n", node.nodename, *args],
            env=self._env(node), capture_output=True, text=True, timeout=timeout, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(
                f"{tool} -n {node.nodename} {' '.join(args)} failed ({done.returncode}): "
                f"{done.stdout}{done.stderr}"
            )
        return done.stdout

    def any_ctl(self, *args: str, tool: str = "rabbitmqctl") -> str:
        """A command on the first running node (for cluster-wide reads and vhosts)."""
        node = next(n for n in self.nodes if n.alive)
        return self.ctl(node, *args, tool=tool)

    # -- node lifecycle --------------------------------------------------------------------

    def start(self, node: Node) -> None:
        """Start the node's VM and wait until its app has booted."""
        log = (self.root / f"{node.name}.out").open("ab")
        node.process = subprocess.Popen(
            [str(RABBITMQ_BIN / "rabbitmq-server")], env=self._env(node),
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        log.close()
        self.await_boot(node)
        node.vm_pid = self.pid(node)

    def await_boot(self, node: Node) -> None:
        deadline = time.monotonic() + BOOT_TIMEOUT_SECONDS
        while True:
            if not node.alive:
                raise RuntimeError(f"{node.nodename} exited at start:\n{self.boot_log(node)}")
            try:
                self.ctl(node, "await_startup", "--timeout", "30", timeout=40)
                return
            except (RuntimeError, subprocess.TimeoutExpired):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)  # the VM is not up yet to answer the CLI: ask again

    def boot_log(self, node: Node) -> str:
        path = self.root / f"{node.name}.out"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def pid(self, node: Node) -> int:
        """The PID of the node's Erlang VM, as the node reports it."""
        return int(self.ctl(node, "eval", "list_to_integer(os:getpid()).").strip())

    def kill(self, node: Node) -> None:
        """``kill -9`` the node's VM (by the PID it reported at boot) and wait until it has
        exited."""
        pid = node.vm_pid
        pidfd = os.pidfd_open(pid)
        try:
            os.kill(pid, signal.SIGKILL)
            readable, _, _ = select.select([pidfd], [], [], 30)
            if not readable:
                raise TimeoutError(f"{node.nodename} (pid {pid}) still runs 30 s after SIGKILL")
        finally:
            os.close(pidfd)
        if node.process is not None:
            node.process.wait(timeout=30)  # the start script ends with its VM

    def ensure_running(self) -> None:
        """Start again every node that is not running (it rejoins the cluster by itself)."""
        down = [node for node in self.nodes if not node.alive]
        with ThreadPoolExecutor(max(len(down), 1)) as pool:
            list(pool.map(self.start, down))
        if down:
            self.ctl(self.nodes[0], "await_online_nodes", str(len(self.nodes)))

    def form(self) -> None:
        """Start every node (in parallel), then join the others to the first."""
        with ThreadPoolExecutor(len(self.nodes)) as pool:
            list(pool.map(self.start, self.nodes))
        first = self.nodes[0]
        for node in self.nodes[1:]:
            self.ctl(node, "stop_app")
            self.ctl(node, "join_cluster", first.nodename)
            self.ctl(node, "start_app")
        self.ctl(first, "await_online_nodes", str(len(self.nodes)))

    def stop(self) -> None:
        """End every node we started (``rabbitmqctl stop``, then its PID), bounded."""
        for node in self.nodes:
            if node.alive:
                with suppress(RuntimeError, subprocess.TimeoutExpired):
                    self.ctl(node, "stop", timeout=60)
            self._end(node)

    def _end(self, node: Node) -> None:
        process = node.process
        if process is None:
            return
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)  # its own session: the script and its VM
            process.wait(timeout=30)

    # -- what the scenarios read ----------------------------------------------------------

    def add_vhost(self, vhost: str) -> None:
        self.any_ctl("add_vhost", vhost)
        self.any_ctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")

    def delete_vhost(self, vhost: str) -> None:
        self.any_ctl("delete_vhost", vhost)

    def queue_depths(self, vhost: str) -> dict[str, int]:
        """Messages (ready and unacked) per queue of ``vhost``."""
        out = self.any_ctl("list_queues", "-p", vhost, "name", "messages", "--no-table-headers")
        depths = {}
        for line in out.splitlines():
            if line.strip():
                name, count = line.split()
                depths[name] = int(count)
        return depths

    def connection_nodes(self) -> dict[str, str]:
        """The node each notifier connection is on, by the name notifier gives it
        (``workers.webhook``, ``relay`` …), from ``list_connections``."""
        out = self.any_ctl("list_connections", "pid", "client_properties", "--no-table-headers")
        found: dict[str, str] = {}
        for line in out.splitlines():
            pid, name = _CONNECTION_PID.search(line), _CONNECTION_NAME.search(line)
            if pid and name:
                found[name.group(1)] = pid.group(1)
        return found

    def queue_leader(self, vhost: str, queue: str) -> str:
        """The node that leads the quorum queue ``queue``."""
        out = self.any_ctl("list_queues", "-p", vhost, "name", "leader", "--no-table-headers")
        for line in out.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0] == queue:
                return parts[1]
        raise LookupError(f"no queue {queue} in {vhost}: {out}")


@contextmanager
def open_cluster(count: int = NODES) -> Iterator[Cluster]:
    """A formed cluster of ``count`` nodes, stopped and removed on exit."""
    root = Path(tempfile.mkdtemp(prefix="notifier-cluster-"))
    try:
        cluster = Cluster(root, count)
        try:
            cluster.form()
            yield cluster
        finally:
            cluster.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
