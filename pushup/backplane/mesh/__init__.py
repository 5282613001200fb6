"""The mesh engine: every node sends what it accepts to every peer, over an
authenticated replication stream, and fills what it missed by repair. One
module per boundary: ``dial`` and ``peers`` connect out (a link's ``outbound``
is what outlives its connections, its ``status`` what it shows), ``stream``
frames the connection, ``endpoints`` is its ``Mount`` in the HTTP front,
``mesh`` is the ``Backplane``; ``wire``, ``acks`` and ``outbound`` are pure.
Imports the core, the config, the seam and this folder only.
"""
