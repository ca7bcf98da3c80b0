"""A Ray cluster started the way users start one: `ray start --head` and `ray start --address=...`, on this machine.

Each node is a `ray start --block` process in a session of its own, so the test can stop (or kill) exactly the
processes of one node by process group, never anything else on the machine. The cluster has its own temp
directory, so no other Ray user on this machine finds it by accident. Ray 2.60 turns token authentication on for
`ray start` clusters: every process here uses RAY_AUTH_MODE=token with a token of the cluster's own, written to
its temp directory (RAY_AUTH_TOKEN_PATH): on a fresh machine there is no ~/.ray/auth_token until some Ray instance
wrote one, and `ray start` does not write it.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

from verlx.utils.distributed import free_port

RAY = os.path.join(os.path.dirname(sys.executable), "ray")


@dataclass
class CliNode:
    name: str  # its custom resource, to find it in the node list
    process: subprocess.Popen
    log: str


@dataclass
class CliCluster:
    address: str
    temp_dir: str
    env: dict
    nodes: dict[str, CliNode] = field(default_factory=dict)

    def start_node(self, name: str, num_cpus: int, head: bool = False, timeout_s: float = 120) -> CliNode:
        flags = ["--head", f"--port={self.address.rsplit(':', 1)[1]}", "--include-dashboard=false",
                 f"--temp-dir={self.temp_dir}"] if head else [f"--address={self.address}"]
        log = os.path.join(self.temp_dir, f"{name}.log")
        with open(log, "w") as out:
            process = subprocess.Popen(
                [RAY, "start", "--block", *flags, f"--num-cpus={num_cpus}", "--num-gpus=0",
                 "--node-ip-address=127.0.0.1", "--disable-usage-stats", f"--resources={json.dumps({name: 1})}"],
                env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        node = self.nodes[name] = CliNode(name, process, log)
        deadline = time.monotonic() + timeout_s
        while name not in self.node_ids():
            if process.poll() is not None or time.monotonic() > deadline:
                with open(log) as f:
                    raise RuntimeError(f"ray start for node {name} did not come up:\n{f.read()[-3000:]}")
            time.sleep(1)
        return node

    def node_ids(self) -> dict[str, str]:
        """Custom resource name → Ray node id of every alive node (asked in a separate process)."""
        code = (f"import json, ray; ray.init(address={self.address!r}, logging_level='ERROR'); "
                "print(json.dumps({r: n['NodeID'] for n in ray.nodes() if n['Alive'] for r in n['Resources']}))")
        done = subprocess.run([sys.executable, "-c", code], env=self.env, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            return {}
        return json.loads(done.stdout.strip().splitlines()[-1])

    def kill_node(self, name: str) -> None:
        """SIGKILL every process of one node: a machine that dies."""
        node = self.nodes.pop(name)
        os.killpg(node.process.pid, signal.SIGKILL)
        node.process.wait(timeout=60)

    def stop(self, grace_s: float = 2) -> None:
        """SIGTERM to every node at once; what is still running after `grace_s` is killed (a head node's own
        shutdown took 30 s, and the worker node's 10: more than the suite should spend on a cluster it throws
        away)."""
        nodes = [self.nodes.pop(name) for name in list(self.nodes)]
        for node in nodes:
            _signal_group(node.process.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for node in nodes:
            try:
                node.process.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                _signal_group(node.process.pid, signal.SIGKILL)
                node.process.wait(timeout=30)
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def _signal_group(pid: int, sig: int) -> None:
    """`sig` to a node's process group; a group already gone (a node that failed to start) is no error."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, sig)


def start_cli_cluster(cpus_per_node: int, names=("head_node", "worker_node")) -> CliCluster:
    """A head and (len(names) - 1) worker nodes, each with `cpus_per_node` CPUs; PYTHONPATH as this process's."""
    temp_dir = tempfile.mkdtemp(prefix="vxray", dir="/tmp")  # short: Ray's socket paths must stay < 108 bytes
    token_path = os.path.join(temp_dir, "auth_token")
    with open(token_path, "w") as f:
        f.write(secrets.token_hex(32))
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": token_path,
           "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop("RAY_ADDRESS", None)
    cluster = CliCluster(f"127.0.0.1:{free_port()}", temp_dir, env)
    try:
        cluster.start_node(names[0], cpus_per_node, head=True)
        for name in names[1:]:
            cluster.start_node(name, cpus_per_node)
    except BaseException:
        cluster.stop()
        raise
    return cluster
