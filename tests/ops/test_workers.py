"""pushup/ops/workers.py (its supervisor on real processes: tests/cluster/test_workers*.py):
a worker's command line says its supervisor's settings:
read back by the config loader, it is the same configuration."""
from __future__ import annotations

from dataclasses import replace

from pushup.config import Config, load
from pushup.ops.workers import worker_argv, worker_env


def test_a_workers_command_line_reads_back_as_its_supervisors_settings():
    config = Config(node_id="n", workers=2, port=8000, message_ttl=5.0,
                    cors_origin=("http://localhost:8000", "http://127.0.0.1:8000"),
                    allow_open_publish=True, cluster_secret="s",
                    peer=("http://10.0.0.2:8000", "http://10.0.0.3:8000"))
    argv = worker_argv(config, 0, 8000)
    assert argv[3] == "serve" and "s" not in argv  # the secret goes in the environment
    back = load(argv[3:], {"PUSHUP_CLUSTER_SECRET": "s"})
    assert back == replace(config, workers=1, node_id="n-0")


def test_a_worker_runs_the_core_its_supervisor_was_asked_for():
    # PUSHUP_PURE=1 (the interpreted core, for profiling) is not a setting the
    # command line carries: the environment must, or the workers run compiled.
    env = worker_env(Config(workers=2, cluster_secret="s"),
                     {"PUSHUP_PURE": "1", "PUSHUP_PORT": "9", "HOME": "/root"})
    assert env == {"PUSHUP_PURE": "1", "PUSHUP_CLUSTER_SECRET": "s", "HOME": "/root"}
