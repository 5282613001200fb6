"""How PushUp is measured. Nothing here is imported by the server.

- ``bench/``: ``make bench`` (``python -m loadtest.bench``): our scenarios and
  the same ones against nginx + nchan, ratios from one run; ``--only`` picks
  them (memory, fan-out, publish, cluster, engines, scale, workers, faults,
  soak, nchan…).
- ``paper/``: ``make loadtest`` (``python -m loadtest.paper.run``): the PushUp
  paper's evaluation with real Locust, its tables and figures.
- ``experiments/``: ``make experiments``: the seed studies (select, poll and
  epoll under idle polls; fan-out over a slow, small-MTU link) rerun.
- ``cgroups``: a CPU cgroup (v1) per process, made and removed by the run;
  ``netcount``: bytes and packets on the wire, counted by nftables.
- ``results/``: the committed results of ``make loadtest RESULTS=1``.
"""
