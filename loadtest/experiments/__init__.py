"""The seeds' experiments rerun on PushUp (issue 11): `python -m loadtest.experiments`.

* `reactors` (seeds 000, 001, 004): select, poll and epoll under N idle held
  polls, with an open-loop rate-controlled load (`rate.py`) of pull subscribes
  and publishes; reply rate, latency, server CPU per reply; strace counts.
* `wan` (seed 002): fan-out to held polls in a private network namespace
  behind a veth pair (`netns.py`), varying the MTU and a tbf bandwidth cap;
  server CPU and packets per delivery, fan-out trip time.

The load is the bench's raw-epoll client (loadtest/bench) with one more
command; `measure.py` brackets every point with CPU counters; `figures.py`
draws the PNGs from the JSON lines alone.
"""
