"""The paper's evaluation, rerun with real Locust (`make loadtest`): ``run``
drives it (servers, Locust processes, network counters, CPU budgets) and
writes results.jsonl; ``users`` are the Locust users (the locustfile);
``mlp`` is the paper's thread-per-connection baseline on our own store;
``report`` turns results into report.md and its figures.
"""
