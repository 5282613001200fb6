"""The Redis engine: one ordered log in Redis that every node appends to
and tails. ``client`` is the only module that speaks to Redis (pipelined,
replies parsed by hiredis); ``engine`` is the ``Backplane``, over
``publishing`` (the appends), ``interest`` (which partitions a node follows)
and ``reader`` (their logs, in order). Imports the core, the config, the seam
and this folder only.
"""
