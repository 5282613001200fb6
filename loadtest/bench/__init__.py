"""`python -m loadtest.bench`: PushUp's benchmark harness.

It starts a fresh `pushup serve` for each benchmark, drives it from a pool of
load-generator processes (raw non-blocking sockets on epoll, HTTP/1.1
keep-alive, source addresses spread over 127.0.0.2-127.0.0.9), and reads CPU and
memory from /proc for the server, the generator and the rest of the machine, so
that every figure comes with the evidence of what limited it.

Modules: `procfs` (reading /proc), `server` (one server process's lifecycle),
`client` (the generator process's event loop), `pool` (the controller's handle
on the generator processes), `scenarios` (the five benchmarks), `report`
(table and JSON), `__main__` (the command line).
"""
